"""The package's layers call down only and no module imports itself back through others.

Every import is counted, also those inside functions (an import cycle hidden in a function is
still a cycle). Layers: cli -> runner/job -> methods -> algorithms | analysis -> privacy, models,
comm, data -> results, rng, errors, jobspec. A module's layer is its package's (by name prefix),
except the modules of mpi_dp/p2p, one method's code in one package, each of which is in the
layer `LAYER_OF` names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "mpi_dp"

RANK = {
    "mpi_dp.cli": 6, "mpi_dp.__main__": 7,
    "mpi_dp.runner": 5, "mpi_dp.job": 5, "mpi_dp.audit": 5,
    "mpi_dp.methods": 4, "mpi_dp.run_async": 4,
    "mpi_dp.algorithms": 3, "mpi_dp.analysis": 3,
    "mpi_dp.privacy": 2, "mpi_dp.models": 2, "mpi_dp.comm": 2, "mpi_dp.data": 2,
    "mpi_dp.results": 1, "mpi_dp.rng": 1, "mpi_dp.pcg": 1, "mpi_dp.errors": 1, "mpi_dp.jobspec": 1,
    "mpi_dp": 0,
}
#: imports within one rank that are not allowed: the algorithms and the analysis are siblings;
#: comm knows nothing about learning; privacy and models are plain functions on arrays
FORBIDDEN = {("mpi_dp.algorithms", "mpi_dp.analysis"), ("mpi_dp.analysis", "mpi_dp.algorithms"),
             ("mpi_dp.comm", "mpi_dp.privacy"), ("mpi_dp.comm", "mpi_dp.models"),
             ("mpi_dp.privacy", "mpi_dp.comm"), ("mpi_dp.models", "mpi_dp.comm"),
             ("mpi_dp.privacy", "mpi_dp.data"), ("mpi_dp.models", "mpi_dp.data")}
NO_MPI = ("mpi_dp.privacy", "mpi_dp.models")
#: PETSc is itself an MPI library: its backend initialises it on MPI.COMM_SELF, and the seed-004
#: reference solves objective (2) with KSP distributed over the caller's communicator (imported
#: inside that one function)
MPI_ALLOWED = {"mpi_dp.models.petsc_backend", "mpi_dp.p2p.reference"}
#: modules whose layer is not their package's: the p2p method's package spans layers, one per
#: module (see mpi_dp/p2p/__init__.py); FORBIDDEN and NO_MPI apply to them as to their layer's own
LAYER_OF = {
    "mpi_dp.p2p.method": "mpi_dp.methods",
    "mpi_dp.p2p.coordinate_descent": "mpi_dp.algorithms",
    "mpi_dp.p2p.peer_data": "mpi_dp.algorithms",
    "mpi_dp.p2p.driver": "mpi_dp.algorithms",
    "mpi_dp.p2p.evaluation": "mpi_dp.algorithms",
    "mpi_dp.p2p.reference_cache": "mpi_dp.algorithms",
    "mpi_dp.p2p.baselines": "mpi_dp.algorithms",
    "mpi_dp.p2p.objective": "mpi_dp.models",
    "mpi_dp.p2p.grad_scratch": "mpi_dp.models",
    "mpi_dp.p2p.reference": "mpi_dp.models",
    "mpi_dp.p2p.report": "mpi_dp.analysis",
}
#: packages whose every module must be in LAYER_OF (their package's name is no layer)
MIXED = ("mpi_dp.p2p",)


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """mpi_dp modules (and mpi4py) imported anywhere in the module, resolved."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES}
            found |= subs
            if len(subs) < len(node.names):  # names from the module itself, not only submodules
                found.add(mod)
    return {m for m in found if m in MODULES or m.startswith("mpi4py")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    if module in LAYER_OF:
        return LAYER_OF[module]
    best = "mpi_dp"
    for key in RANK:
        if (module == key or module.startswith(key + ".")) and len(key) > len(best):
            best = key
    return best


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(GRAPH.get(m, ())):
            if dep not in MODULES:
                continue
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if m not in state:
            visit(m)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports of `graph` that go up a layer or across a FORBIDDEN pair."""
    bad = []
    for m, deps in graph.items():
        lm = _layer(m)
        for d in deps:
            if d not in MODULES or d == "mpi_dp":
                continue
            ld = _layer(d)
            if ld == lm:
                continue
            if RANK[ld] > RANK[lm] or (lm, ld) in FORBIDDEN:
                bad.append(f"{m} ({lm}) imports {d} ({ld})")
    return sorted(bad)


def _mpi_users(graph: dict[str, set[str]]) -> list[str]:
    """The modules of the NO_MPI layers (MPI_ALLOWED aside) that import mpi4py."""
    return sorted(m for m, deps in graph.items() if _layer(m) in NO_MPI and m not in MPI_ALLOWED
                  and any(d.startswith("mpi4py") for d in deps))


def test_layers_call_down_only():
    bad = _upward(GRAPH)
    assert not bad, "\n".join(bad)


def test_privacy_and_models_never_import_mpi():
    assert not _mpi_users(GRAPH)


def test_every_module_of_a_mixed_package_has_a_layer():
    """A new module of mpi_dp/p2p must be given its layer (it would otherwise be checked as a
    leaf of mpi_dp, by accident)."""
    missing = [m for m in MODULES for pkg in MIXED if m.startswith(pkg + ".") and m not in LAYER_OF]
    assert not missing, missing
    assert set(LAYER_OF) <= set(MODULES), sorted(set(LAYER_OF) - set(MODULES))
    assert all(not GRAPH[pkg] for pkg in MIXED), "a mixed package's __init__ imports nothing"


def test_the_checks_catch_a_p2p_module_in_the_wrong_layer():
    """The p2p modules are checked as their layers: an import that breaks a rule of the layer is
    found (model math importing mpi4py or comm, an algorithm importing the analysis, ...)."""
    assert _layer("mpi_dp.p2p.objective") == "mpi_dp.models"
    assert _layer("mpi_dp.p2p.driver") == "mpi_dp.algorithms"
    bad_edges = {
        "mpi_dp.p2p.objective": {"mpi4py.MPI", "mpi_dp.comm.rma"},       # NO_MPI; models -> comm
        "mpi_dp.p2p.reference": {"mpi_dp.p2p.driver"},                   # models -> algorithms
        "mpi_dp.p2p.coordinate_descent": {"mpi_dp.p2p.report"},          # algorithms -> analysis
        "mpi_dp.p2p.report": {"mpi_dp.p2p.evaluation"},                  # analysis -> algorithms
        "mpi_dp.p2p.driver": {"mpi_dp.p2p.method"},                      # algorithms -> methods
    }
    graph = {m: set(GRAPH[m]) | bad_edges.get(m, set()) for m in GRAPH}
    assert sorted(set(_mpi_users(graph)) - set(_mpi_users(GRAPH))) == ["mpi_dp.p2p.objective"]
    up = sorted(set(_upward(graph)) - set(_upward(GRAPH)))
    assert len(up) == 5 and all(any(line.startswith(f"{m} (") and d in line for line in up)
                                for m, ds in bad_edges.items() for d in ds if d in MODULES), up


def test_the_check_sees_function_level_imports():
    """The analysis above would catch a hidden cycle: the CLI's lazy imports are in the graph."""
    assert "mpi_dp.methods" in GRAPH["mpi_dp.cli"] and "mpi_dp.runner" in GRAPH["mpi_dp.cli"]
    assert {"mpi_dp.methods", "mpi_dp.jobspec"} <= GRAPH["mpi_dp.job"]
