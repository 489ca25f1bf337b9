"""Formulas of DP inexact ADMM (ObjT / ObjP) and the DP-ADMM output-perturbation baseline (OutP).

Pure NumPy, no MPI: spec /work/shared/specs/dp-inexact-admm.md §2-§5. Parameter arrays carry a runs
axis first, (R, J, K) (a plain (J, K) works too: every update is elementwise); rho, eta, delta are
per-iteration scalars shared by all runs. The noise itself is drawn by the agent's release path
(mpi_dp.privacy.release, from the configuration's contract), which also sets OutP's sigma (the
rule's noise of the release's L2 sensitivity `outp_l2_sensitivity`); these functions set the
Laplace scale (11c) at the contract's eps_bar and use the noise. eps_bar = inf means
non-private: every noise scale is 0.
"""

from __future__ import annotations

import math
from typing import SupportsFloat

import numpy as np

#: Sensitivity rules of spec §3.3 (the first is the reference code's and the default).
SENS_MODES = ("local_max", "local_max_x2", "global", "bound")
#: Trust-radius schedules of ObjT (spec §2.5).
TR_SCHEDULES = ("const", "inv_sq")
#: Standard-deviation conventions of the OutP noise (spec §4).
OUTP_NOISE_STDS = ("sigma_sq", "sigma")
#: Penalty variants (spec §5, App. A.9).
RHO_VARIANTS = ("dynamic_1", "dynamic_2", "static")
#: Regulariser-gradient conventions inside the agents (spec §6).
REG_GRADS = ("consistent", "code")


def _eps(eps_bar: float) -> float:
    eps = float(eps_bar)
    if not eps > 0:  # also rejects NaN
        raise ValueError(f"eps_bar must be > 0 (inf = non-private), got {eps_bar}")
    return eps


def _positive(name: str, value: SupportsFloat) -> float:
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return v


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {choices}")
    return value


# ---------------------------------------------------------------- schedules (spec §2.5, §4, §5)

def rho_schedule(
    t: int, c1: float, c2: float, tc: int, eps_bar: float, growth: float = 1.2, cap: float = 1e9
) -> float:
    """Penalty (21): rho^t = min(cap, c1 growth^floor((t+1)/T_c) + c2/eps_bar).

    The c2 term is dropped for eps_bar = inf. Non-decreasing in t and bounded by `cap`; huge t
    does not overflow (the power is taken in the log domain and saturates at the cap).
    """
    eps = _eps(eps_bar)
    if t < 0 or tc <= 0 or not growth >= 1 or not c1 > 0:
        raise ValueError(f"need t >= 0, T_c > 0, growth >= 1, c1 > 0; got t={t}, T_c={tc}, "
                         f"growth={growth}, c1={c1}")
    steps = (int(t) + 1) // int(tc)
    extra = 0.0 if math.isinf(eps) else c2 / eps
    if steps * math.log(growth) + math.log(c1) > math.log(cap):
        return float(cap)
    return float(min(cap, c1 * growth**steps + extra))


def rho_variant(
    t: int, variant: str, c1: float, c2: float, tc: int, eps_bar: float,
    static: float | None = None, growth: float = 1.2, cap: float = 1e9,
) -> float:
    """Penalty of a variant (App. A.9): 'dynamic_1' = (21), 'dynamic_2' = (21)/100, 'static' = `static`."""
    _choice("rho variant", variant, RHO_VARIANTS)
    if variant == "static":
        if static is None:
            raise ValueError("rho variant 'static' needs a static value")
        return _positive("static rho", static)
    rho = rho_schedule(t, c1, c2, tc, eps_bar, growth, cap)
    return rho / 100.0 if variant == "dynamic_2" else rho


def eta_objp(t: int, a: float) -> float:
    """ObjP proximal parameter eta^t = a / sqrt(t+1) (the paper's 1/sqrt(t) counted from t = 1)."""
    return _positive("a", a) / math.sqrt(t + 1)


def delta_objt(t: int, a: float, schedule: str = "const") -> float:
    """ObjT trust radius delta^t: 'const' -> a, 'inv_sq' -> a / (t+1)^2.

    The prose says a/t^2, but the reference code writes ``a/(t+1)*(t+1)``, which Python evaluates as
    (a/(t+1))*(t+1) = a (operator precedence), so the released results used a constant radius:
    'const' reproduces them. With 'inv_sq' the radii sum to <= 1.645 a, which caps how far each
    coordinate can ever move.
    """
    a = _positive("a", a)
    _choice("trust-radius schedule", schedule, TR_SCHEDULES)
    return a if schedule == "const" else a / (t + 1) ** 2


def outp_inv_eta(t: int, a: float, n_p: int, eps_bar: float, dp_delta: float = 1e-6) -> float:
    """OutP 1/eta_p^t = [0.25 I_p + 2 sqrt((t+1) ln(1.25/dp_delta)) / eps_bar] / a (spec §4).

    This is Huang et al.'s c3 + 4 c1 sqrt(JK(t+1) ln(1.25/delta)) / (I_p eps c_w) with c1 = I_p,
    c3 = 0.25 I_p, c_w = 2 sqrt(JK) simplified (J and K cancel). eps_bar = inf: 0.25 I_p / a.
    """
    eps = _eps(eps_bar)
    if not 0 < dp_delta < 1:
        raise ValueError(f"dp_delta must be in (0, 1), got {dp_delta}")
    if n_p <= 0:
        raise ValueError(f"agent size I_p must be > 0, got {n_p}")
    a = _positive("a", a)
    extra = 0.0 if math.isinf(eps) else 2.0 * math.sqrt((t + 1) * math.log(1.25 / dp_delta)) / eps
    return (0.25 * n_p + extra) / a


def outp_l2_sensitivity(rho: float, inv_eta: float) -> float:
    """L2 sensitivity 2 / (rho + 1/eta) of OutP's z_p (Huang et al.: 2 c1 / (I_p (rho + 1/eta))
    with c1 = I_p)."""
    return 2.0 / (_positive("rho", rho) + _positive("1/eta", inv_eta))


def outp_noise_std(sigma: float | np.ndarray, convention: str) -> float | np.ndarray:
    """Standard deviation actually used for the OutP noise: sigma^2 ('sigma_sq', the reference code's
    quirk, less noise when sigma < 1) or sigma ('sigma', Huang et al.'s mechanism); elementwise
    for an array of sigmas (one per agent)."""
    _choice("OutP noise convention", convention, OUTP_NOISE_STDS)
    if np.ndim(sigma):
        s = np.asarray(sigma, dtype=np.float64)
        return s * s if convention == "sigma_sq" else s
    return sigma * sigma if convention == "sigma_sq" else float(sigma)


# ---------------------------------------------------------------- updates (spec §2-§4)

def project(W: np.ndarray, w_bound: float | None) -> np.ndarray:
    """Proj_W: identity for an unconstrained W (None), elementwise clip to [-B, B] for a box."""
    W = np.asarray(W, dtype=np.float64)
    if w_bound is None:
        return W
    B = _positive("w_bound", w_bound)
    return np.clip(W, -B, B)


def server_contribution(rho: float, z: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """One agent's term rho z_p - lam_p of the sum U that the server averages."""
    return rho * np.asarray(z, dtype=np.float64) - lam


def server_average(sum_u: np.ndarray, P: int, rho: float, w_bound: float | None = None) -> np.ndarray:
    """Server update (4a): w = Proj_W(U / (P rho)) with U = sum_p (rho z_p - lam_p).

    Equals Proj_W((1/P) sum_p (z_p - lam_p/rho)), the exact minimiser of
    sum_p <lam_p, w - z_p> + (rho/2)||w - z_p||^2 over W (separable, equal curvature).
    """
    if P <= 0:
        raise ValueError(f"number of agents P must be > 0, got {P}")
    return project(np.asarray(sum_u, dtype=np.float64) / (P * _positive("rho", rho)), w_bound)


def _xi(xi: np.ndarray | None) -> np.ndarray | float:
    return 0.0 if xi is None else np.asarray(xi, dtype=np.float64)


def objp_update(
    w: np.ndarray, lam: np.ndarray, g: np.ndarray, z: np.ndarray, xi: np.ndarray | None,
    rho: float, eta: float, w_bound: float | None = None,
) -> np.ndarray:
    """ObjP agent step (8) in closed form (spec §3.4); xi = None or 0 gives IADMM-Prox (5):

    z+ = Proj_W((rho w + lam - g - xi + z/eta) / (rho + 1/eta)).
    """
    rho, inv_eta = _positive("rho", rho), 1.0 / _positive("eta", eta)
    num = rho * np.asarray(w, dtype=np.float64) + lam - g - _xi(xi) + np.asarray(z) * inv_eta
    return project(num / (rho + inv_eta), w_bound)


def objt_update(
    w: np.ndarray, lam: np.ndarray, g: np.ndarray, z: np.ndarray, xi: np.ndarray | None,
    rho: float, delta: float, w_bound: float | None = None,
) -> np.ndarray:
    """ObjT agent step (9) in closed form (spec §3.4); xi = None or 0 gives IADMM-Trust (6):

    z+ = clip(w + (lam - g - xi)/rho, lo, hi), lo = max(z - delta, -B), hi = min(z + delta, B).
    Clipping is exact: the objective is separable with curvature rho in every coordinate.
    """
    rho, delta = _positive("rho", rho), _positive("delta", delta)
    z = np.asarray(z, dtype=np.float64)
    lo, hi = z - delta, z + delta
    if w_bound is not None:
        B = _positive("w_bound", w_bound)
        lo, hi = np.maximum(lo, -B), np.minimum(hi, B)
    return np.clip(np.asarray(w, dtype=np.float64) + (lam - g - _xi(xi)) / rho, lo, hi)


def outp_update(
    w: np.ndarray, lam: np.ndarray, g: np.ndarray, z: np.ndarray, rho: float,
    inv_eta: float | np.ndarray,
) -> np.ndarray:
    """OutP agent step before its noise (spec §4): (rho w^t + lam - g + z inv_eta) / (rho + inv_eta).

    The caller adds N(0, s^2) noise (s from `outp_noise_std`) to obtain the released z~_p.
    `inv_eta` may be an array broadcasting against z (a block of agents: one per agent), each
    entry giving what the scalar gives.
    """
    rho = _positive("rho", rho)
    if np.ndim(inv_eta):
        inv_eta = np.asarray(inv_eta, dtype=np.float64)
        if not np.all((inv_eta > 0) & np.isfinite(inv_eta)):
            raise ValueError(f"1/eta must be positive and finite, got {inv_eta}")
    else:
        inv_eta = _positive("1/eta", inv_eta)
    return (rho * np.asarray(w, dtype=np.float64) + lam - g + np.asarray(z) * inv_eta) / (rho + inv_eta)


def dual_update(lam: np.ndarray, rho: float, w: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Dual step (4c): lam + rho (w - z), with the rho of the same iteration's (4a)."""
    return np.asarray(lam, dtype=np.float64) + rho * (np.asarray(w, dtype=np.float64) - z)


def agent_gradient(
    grad_sum: np.ndarray, n_total: int, gamma: float, n_agents: int, z: np.ndarray,
    w: np.ndarray, reg_grad: str = "consistent",
) -> np.ndarray:
    """g_p = grad f_p for ObjT/ObjP: grad_sum / I (global I) plus the regulariser gradient,
    2 (gamma/P) z_p ('consistent': the sum over agents is grad F) or 2 gamma w ('code', spec §6)."""
    _choice("reg_grad", reg_grad, REG_GRADS)
    if reg_grad == "consistent":
        reg = 2.0 * (gamma / n_agents) * np.asarray(z)
    else:
        reg = 2.0 * gamma * np.asarray(w)
    return np.asarray(grad_sum, dtype=np.float64) / n_total + reg


def outp_gradient(grad_sum: np.ndarray, n_p: int | np.ndarray, gamma: float, w: np.ndarray
                  ) -> np.ndarray:
    """OutP gradient (spec §4): grad_sum / I_p (local average) + 2 gamma w^t (n_p may be an
    array broadcasting against grad_sum: one I_p per agent of a block)."""
    return np.asarray(grad_sum, dtype=np.float64) / n_p + 2.0 * gamma * np.asarray(w)


# ---------------------------------------------------------------- noise scale (spec §3.2-§3.3)

def sensitivity(
    terms_max: np.ndarray | float | None, n_total: int, mode: str = "local_max",
    n_features: int | None = None, row_bound: float | None = None,
) -> np.ndarray | float:
    """l1 sensitivity Delta_bar_p^t of the agent's gradient (spec §3.3, eq. (20)).

    terms_max = max_i ||x_i||_1 ||h_i - y_i||_1 over the agent's records at z_p^t (per run, e.g.
    ``multinomial.sensitivity_terms(...).max(axis=1)``). Modes: 'local_max' = terms_max / I (the
    reference code; data-dependent, kept for parity), 'local_max_x2' = 2 terms_max / I (replace-one
    bound), 'global' = 4 J / I (x in [0,1]^J, ||h - y||_1 <= 2: needs no private data, strict mode;
    returns a float, terms_max is ignored), 'bound' = 4 sqrt(J) B / I (every record's L2 norm
    <= B, a public bound: ||x||_1 <= sqrt(J) B; a float, needs no private data).
    """
    _choice("sensitivity mode", mode, SENS_MODES)
    if n_total <= 0:
        raise ValueError(f"total sample count I must be > 0, got {n_total}")
    if mode == "global":
        if n_features is None or n_features <= 0:
            raise ValueError("sensitivity mode 'global' needs n_features (J > 0)")
        return 4.0 * n_features / n_total
    if mode == "bound":
        if n_features is None or n_features <= 0 or row_bound is None or not row_bound > 0:
            raise ValueError("sensitivity mode 'bound' needs n_features and a row bound B > 0")
        return 4.0 * math.sqrt(n_features) * row_bound / n_total
    if terms_max is None:
        raise ValueError(f"sensitivity mode {mode!r} needs terms_max")
    m = np.asarray(terms_max, dtype=np.float64)
    if np.any(m < 0) or not np.all(np.isfinite(m)):
        raise ValueError("terms_max must be finite and >= 0")
    out = (2.0 * m if mode == "local_max_x2" else m) / n_total
    return float(out) if out.ndim == 0 else out


def laplace_scale(sens: np.ndarray | float, eps_bar: float) -> np.ndarray | float:
    """Laplace scale b = Delta_bar / eps_bar (11c); 0 for eps_bar = inf (xi = 0)."""
    eps = _eps(eps_bar)
    s = np.asarray(sens, dtype=np.float64)
    out = np.zeros_like(s) if math.isinf(eps) else s / eps
    return float(out) if out.ndim == 0 else out
