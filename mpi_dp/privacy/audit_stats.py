"""Statistics of a privacy audit: from the adversary's view in two neighbouring worlds to a
lower bound on eps (Jagielski et al. 2020; Nasr et al. 2021).

Every run gives one release (or a sequence) in world 0 (dataset D) or world 1 (D'). A statistic
maps a release to one number; a threshold test "world 1 if the statistic is >= t" (or <= t) has
false-positive rate FPR (world-0 runs called 1) and false-negative rate FNR. (eps, delta)-DP
forces FPR * e^eps >= 1 - delta - FNR for every test, so with Clopper-Pearson upper bounds

    eps_lower = ln((1 - delta - FNR_upper) / FPR_upper)

is a lower bound on the true eps with the bounds' confidence. The statistic and the threshold
are chosen on one half of the runs (`fit`) and eps_lower is evaluated once on the other half
(`held`), so its confidence is not spent on a search; the whole ROC of the held half is kept for
plots. Pure NumPy/SciPy: no MPI, no method knowledge.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import numpy.typing as npt
from scipy import stats

#: statistics a release can be reduced to
STATISTICS = ("llr", "lda", "scale")


def cp_upper(k: np.ndarray | int, n: int, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bound (confidence 1 - alpha) on a rate seen k times in n."""
    k = np.asarray(k, dtype=np.float64)
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if np.any((k < 0) | (k > n)):
        raise ValueError("counts must lie in [0, n]")
    with np.errstate(invalid="ignore"):
        hi = stats.beta.ppf(1.0 - alpha, k + 1.0, n - k)
    return np.where(k >= n, 1.0, hi)


def cp_lower(k: np.ndarray | int, n: int, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson lower bound (confidence 1 - alpha)."""
    k = np.asarray(k, dtype=np.float64)
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    with np.errstate(invalid="ignore"):
        lo = stats.beta.ppf(alpha, k, n - k + 1.0)
    return np.where(k <= 0, 0.0, lo)


def eps_from_rates(fpr_hi: npt.ArrayLike, fnr_hi: npt.ArrayLike, delta: float) -> np.ndarray:
    """ln((1 - delta - FNR) / FPR), 0 where the test shows nothing (never negative)."""
    num = 1.0 - delta - np.asarray(fnr_hi, dtype=np.float64)
    den = np.asarray(fpr_hi, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where((num > 0) & (den > 0), np.log(np.maximum(num, 1e-300) / den), 0.0)
    return np.maximum(e, 0.0)


@dataclasses.dataclass(frozen=True)
class Roc:
    """Counts of the test "world 1 if s >= t" over the thresholds t (ascending), both worlds."""

    thresholds: np.ndarray
    fp: np.ndarray  # world-0 runs with s >= t
    tp: np.ndarray  # world-1 runs with s >= t
    n0: int
    n1: int

    def eps_by_direction(self, delta: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """Per threshold, eps_lower of "s >= t says 1" and of "s < t says 1", with
        Clopper-Pearson bounds at alpha / 2 per rate (joint confidence 1 - alpha)."""
        a = alpha / 2
        up = eps_from_rates(cp_upper(self.fp, self.n0, a), cp_upper(self.n1 - self.tp, self.n1, a),
                            delta)
        down = eps_from_rates(cp_upper(self.n0 - self.fp, self.n0, a),
                              cp_upper(self.tp, self.n1, a), delta)
        return up, down

    def best_by_direction(self, delta: float, alpha: float) -> tuple[tuple[float, int], ...]:
        """((eps, index) of "s >= t", (eps, index) of "s < t"): the largest entries of
        `eps_by_direction` and their first indices, without bounding every threshold."""
        a = alpha / 2
        return (_best(self.fp, self.n0, self.n1 - self.tp, self.n1, delta, a),
                _best(self.n0 - self.fp, self.n0, self.tp, self.n1, delta, a))

    def eps(self, delta: float, alpha: float) -> np.ndarray:
        """Per threshold, the larger eps_lower of the two directions."""
        return np.maximum(*self.eps_by_direction(delta, alpha))


@functools.lru_cache(maxsize=16)
def _cp_grid(n: int, a: float) -> tuple[np.ndarray, np.ndarray]:
    """Counts (every one up to 256, then 0.1 % apart) and their cp_upper(count, n, a)."""
    m = max(n, 256)
    grid = np.unique(np.concatenate([np.arange(min(n, 256) + 1), np.geomspace(
        256, m, int(math.log(m / 256) / 0.001) + 2).astype(np.int64), [n]]))
    grid = grid[grid <= n]
    return grid, cp_upper(grid, n, a)


def _cp_upper_floor(k: np.ndarray, n: int, a: float) -> np.ndarray:
    """A lower bound on cp_upper(k, n, a) (which grows with k): its value at the largest grid
    count <= k."""
    grid, u = _cp_grid(int(n), float(a))
    return u[np.searchsorted(grid, k, side="right") - 1]


def _best(kfp: np.ndarray, n0: int, kfn: np.ndarray, n1: int, delta: float, a: float,
          batch: int = 256) -> tuple[float, int]:
    """max and first argmax of eps_from_rates(cp_upper(kfp), cp_upper(kfn)) by branch and
    bound: cp_upper grows with the count, so its value at the grid count just below (a few
    hundred counts per n) caps each threshold's eps, and only thresholds whose cap reaches the
    best value so far get their own (costly) beta quantiles."""
    cap = eps_from_rates(_cp_upper_floor(kfp, n0, a), _cp_upper_floor(kfn, n1, a), delta)
    order = np.argsort(-cap, kind="stable")
    best, at = 0.0, -1
    for i in range(0, order.size, batch):
        idx = order[i:i + batch]
        if cap[idx[0]] < best or cap[idx[0]] <= 0.0:
            break
        e = eps_from_rates(cp_upper(kfp[idx], n0, a), cp_upper(kfn[idx], n1, a), delta)
        m = e.max()
        if m > best:
            best, at = float(m), int(idx[e == m].min())
        elif m == best and m > 0:
            at = min(at, int(idx[e == m].min()))
    if at < 0:  # nothing above 0: every eps is 0 and argmax is the first threshold
        return 0.0, 0
    return best, at


def roc(s0: np.ndarray, s1: np.ndarray) -> Roc:
    """The ROC of statistic values s0 (world 0) and s1 (world 1) at every distinct value."""
    s0 = np.sort(np.asarray(s0, dtype=np.float64))
    s1 = np.sort(np.asarray(s1, dtype=np.float64))
    if not (np.all(np.isfinite(s0)) and np.all(np.isfinite(s1))):
        raise ValueError("audit statistics must be finite")
    t = np.unique(np.concatenate([s0, s1, [np.inf]]))
    fp = len(s0) - np.searchsorted(s0, t, side="left")
    tp = len(s1) - np.searchsorted(s1, t, side="left")
    return Roc(t, fp.astype(np.int64), tp.astype(np.int64), len(s0), len(s1))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """eps_lower from the held-out half at the threshold chosen on the fit half."""

    eps_lower: float
    threshold: float
    direction: int  # +1: "s >= t" says world 1; -1: "s < t" says world 1
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float
    eps_point: float  # ln((1 - delta - FNR) / FPR) without the bounds (may be inf)
    alpha: float


def choose_threshold(s0: np.ndarray, s1: np.ndarray, delta: float, alpha: float
                     ) -> tuple[float, int]:
    """The threshold and direction with the largest bounded eps on these (fit) runs."""
    r = roc(s0, s1)
    (eu, iu), (ed, idn) = r.best_by_direction(delta, alpha)
    if eu >= ed:
        return float(r.thresholds[iu]), 1
    return float(r.thresholds[idn]), -1


def evaluate(s0: np.ndarray, s1: np.ndarray, threshold: float, direction: int, delta: float,
             alpha: float) -> Verdict:
    """eps_lower of one fixed test on held-out runs (Clopper-Pearson at alpha / 2 per rate)."""
    s0, s1 = np.asarray(s0, dtype=np.float64), np.asarray(s1, dtype=np.float64)
    n0, n1 = len(s0), len(s1)
    says1_0 = s0 >= threshold if direction > 0 else s0 < threshold
    says1_1 = s1 >= threshold if direction > 0 else s1 < threshold
    fp, fn = int(says1_0.sum()), int((~says1_1).sum())
    a = alpha / 2
    fpr_hi, fnr_hi = float(cp_upper(fp, n0, a)), float(cp_upper(fn, n1, a))
    e = float(eps_from_rates(fpr_hi, fnr_hi, delta))
    fpr, fnr = fp / n0, fn / n1
    point = math.inf if fp == 0 and 1 - delta - fnr > 0 else (
        math.log((1 - delta - fnr) / fpr) if 1 - delta - fnr > 0 else 0.0)
    return Verdict(e, float(threshold), int(direction), fpr, fnr, fpr_hi, fnr_hi, point, alpha)


# -- statistics ----------------------------------------------------------------------------------
def location(x: np.ndarray, noise: str) -> np.ndarray:
    """Noiseless-mean estimate of releases x (runs, d): the median for Laplace noise (its MLE),
    the mean otherwise."""
    return np.median(x, axis=0) if noise == "laplace" else np.mean(x, axis=0)


def llr(x: np.ndarray, mu0: np.ndarray, mu1: np.ndarray, noise: str, scale: float) -> np.ndarray:
    """Log-likelihood ratio log p1(x) / p0(x) of the claimed i.i.d. noise (Laplace scale b or
    Gaussian sigma) around the two worlds' means; x (runs, d)."""
    if not scale > 0:
        raise ValueError(f"the claimed noise scale must be > 0, got {scale}")
    if noise == "laplace":
        return (np.abs(x - mu0).sum(axis=1) - np.abs(x - mu1).sum(axis=1)) / scale
    if noise == "gaussian":
        return (((x - mu0) ** 2).sum(axis=1) - ((x - mu1) ** 2).sum(axis=1)) / (2 * scale**2)
    raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")


def lda_direction(x0: np.ndarray, x1: np.ndarray, ridge: float = 1e-9) -> np.ndarray:
    """Fisher's discriminant w = (S0 + S1 + ridge)^-1 (m1 - m0) from fit runs x0, x1 (runs, d):
    it finds what the claimed noise model misses, e.g. one noise draw shared by all coordinates
    (a zero-variance direction separates the worlds exactly)."""
    d = x0.shape[1]
    S = np.cov(x0, rowvar=False).reshape(d, d) + np.cov(x1, rowvar=False).reshape(d, d)
    diff = x1.mean(axis=0) - x0.mean(axis=0)
    scale = float(np.trace(S)) / d
    if not scale > 0:  # no noise at all: the mean difference separates the worlds
        return diff
    return np.linalg.solve(S + ridge * scale * np.eye(d), diff)
