"""What `mpi-dp analyze` and `mpi-dp plot` show for an audit result (format mpi_dp.audit)."""

from __future__ import annotations

import math
import pathlib

import h5py
import numpy as np

from mpi_dp import strict_json


def is_audit(path: str | pathlib.Path) -> bool:
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("format") == "mpi_dp.audit"
    except OSError:
        return False


def audit_rows(path: str | pathlib.Path) -> dict:
    with h5py.File(path, "r") as f:
        a = dict(f.attrs)
        stats = {name: dict(g.attrs) for name, g in f["statistics"].items()}
    return {"attrs": a, "statistics": stats}


def audit_text(path: str | pathlib.Path) -> str:
    r = audit_rows(path)
    a = r["attrs"]
    c = strict_json.loads(a["canary"])
    lines = [
        f"{path}: privacy audit of '{a['name']}' ({a['algorithm']}), {a['runs']} runs per world "
        f"({int(a['runs_used'][0])} / {int(a['runs_used'][1])} with the release), "
        f"release {a['release']}",
        f"canary: owner {c['owner']} record {c['record']} ({c['mode']}, {c.get('shape', 'axis')}; ||x||_2 = "
        f"{c['x_norm']:.4g}, labels {c['y0']} / {c['y1']}); mechanism {a['mechanism']}"
        f"{'' if a['certified'] else ' (recorded UNCERTIFIED by the run)'}",
        f"claimed: eps = {a['claimed_eps']:.4g} at delta = {a['claimed_delta']:.3g} "
        f"({a['claimed_source']})",
        "",
        f"{'statistic':<10} {'eps_lower':>9} {'FPR':>8} {'FNR':>8} {'FPR_up':>8} {'FNR_up':>8} "
        f"{'eps_point':>9}",
    ]
    for name, s in r["statistics"].items():
        lines.append(f"{name:<10} {s['eps_lower']:>9.4f} {s['fpr']:>8.4f} {s['fnr']:>8.4f} "
                     f"{s['fpr_upper']:>8.4f} {s['fnr_upper']:>8.4f} {s['eps_point']:>9.4g}")
    conf = 100 * a["confidence"]
    lines += ["", f"eps_lower ({conf:.0f} %, statistic {a['statistic']}) = "
              f"{a['eps_lower']:.4f}  vs claimed {a['claimed_eps']:.4f}:  {a['verdict']}"]
    if a["verdict"] == "VIOLATION":
        lines.append(f"  the run released more than it claims: with {conf:.0f} % confidence the "
                     f"true eps exceeds {a['eps_lower']:.4f} > {a['claimed_eps']:.4f}")
    else:
        lines.append("  (consistent means no test found a violation; a lower bound far below "
                     "the claim says the audit is loose, not that the method is safe)")
    return "\n".join(lines)


def plot_audit(path: str | pathlib.Path, prefix: pathlib.Path) -> list[pathlib.Path]:
    """ROC of each statistic (held-out runs, FPR vs FNR) against the region the claimed
    (eps, delta) allows: FNR >= max(0, 1 - delta - e^eps FPR, e^-eps (1 - delta - FPR))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with h5py.File(path, "r") as f:
        a = dict(f.attrs)
        rocs = {n: (g["roc_fp"][()] / len(g["s0"]), 1 - g["roc_tp"][()] / len(g["s1"]),
                    dict(g.attrs)) for n, g in f["statistics"].items()}
    eps, delta = float(a["claimed_eps"]), float(a["claimed_delta"])
    fig, ax = plt.subplots(figsize=(5.5, 5))
    fpr = np.linspace(0, 1, 401)
    if math.isfinite(eps):
        bound = np.maximum.reduce([np.zeros_like(fpr), 1 - delta - math.exp(eps) * fpr,
                                   math.exp(-eps) * (1 - delta - fpr)])
        ax.fill_between(fpr, 0, bound, color="tab:red", alpha=0.12,
                        label=f"impossible under claimed eps={eps:.3g}")
        ax.plot(fpr, bound, color="tab:red", lw=1)
    for name, (fp, fn, at) in rocs.items():
        ax.plot(fp, fn, lw=1.2, label=f"{name}: eps_lower {at['eps_lower']:.3g}")
        ax.plot(1 - fp, 1 - fn, lw=0.6, ls=":", color=ax.lines[-1].get_color())
    ax.set_xlabel("false positive rate (world D called D')")
    ax.set_ylabel("false negative rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"audit of {a['name']}: {a['verdict']}", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    out = pathlib.Path(f"{prefix}_roc.png")
    fig.tight_layout()
    fig.savefig(out, dpi=150)
    plt.close(fig)
    return [out]

