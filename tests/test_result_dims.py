"""Result files that other tools read: every dataset of every method has named dimensions
(HDF5 dimension scales that xarray shows as coordinates, never phony_dim), per-agent values are
datasets on `agent`, JSON attributes are strict JSON, and every dataset says whether it is
evaluation-only."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
from conftest import METHOD_JOBS

from mpi_dp import strict_json
from mpi_dp.analysis.load import open_result

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

METHODS = tuple(METHOD_JOBS)


def _groups(path) -> list[str]:
    with h5py.File(path, "r") as f:
        out = []
        f.visititems(lambda name, o: out.append(name) if isinstance(o, h5py.Group) else None)
        return ["configs/000"] + [g for g in out if g.startswith("configs/000/")]


@pytest.mark.parametrize("method", METHODS)
def test_xarray_shows_named_dimensions_and_coordinates(method_results, method):
    path = method_results[method]
    ds = xr.open_dataset(path, engine="h5netcdf", group="configs/000")
    assert {"run", "agent"} <= set(ds.coords), ds
    with h5py.File(path, "r") as f:
        g = f["configs/000"]
        np.testing.assert_array_equal(ds["run"].values, np.arange(g.attrs["runs"]))
        assert ds["agent"].size == ds["n"].size == ds["eps"].size
        assert ds["eps"].dims == ("agent",) and ds["n"].dims == ("agent",)
        assert ds["run"].attrs["long_name"] and ds["run"].attrs["units"] == "1"
    m = xr.open_dataset(path, engine="h5netcdf", group="configs/000/metrics")
    assert "iteration" in m.coords and m["iteration"].attrs["long_name"]
    per_run = [v for v in m.data_vars if m[v].ndim == 2]
    assert per_run and all(m[v].dims == ("iteration", "run") for v in per_run)
    for group in _groups(path):
        sub = xr.open_dataset(path, engine="h5netcdf", group=group)
        dims = list(sub.sizes)
        assert not [d for d in dims if d.startswith("phony_dim")], (group, dims)
    # the values are the file's, coordinate for coordinate
    with h5py.File(path, "r") as f:
        for v in per_run:
            np.testing.assert_array_equal(m[v].values, f[f"configs/000/metrics/{v}"][()])


@pytest.mark.parametrize("method", METHODS)
def test_every_dataset_says_whether_it_is_evaluation_only(method_results, method):
    with h5py.File(method_results[method], "r") as f:
        seen = {}

        def visit(name, o):
            if isinstance(o, h5py.Dataset) and name.startswith("configs/"):
                assert "evaluation_only" in o.attrs, name
                seen[name.split("/", 2)[2]] = bool(o.attrs["evaluation_only"])
        f.visititems(visit)
        # what is computed from private records without noise is marked so ...
        for path, ev in seen.items():
            if path.startswith(("reference/", "metrics/psi", "metrics/test_error",
                                "metrics/train_", "metrics/regret", "metrics/Q")):
                assert ev, path
        # ... and the noisy releases' accounting is not
        assert seen["privacy/ledger"] is False and seen["eps"] is False
        listed = strict_json.loads(f["configs/000"].attrs["evaluation_only_attrs"])
        assert isinstance(listed, list)
        if method in ("sync_star", "async_star", "admm", "dola"):
            assert seen["noise_to_signal"] is True


@pytest.mark.parametrize("method", METHODS)
def test_json_attributes_are_strict_and_read_back(method_results, method):
    """No bare Infinity/NaN: a strict parser reads every JSON attribute; eps = inf of the sweep
    comes back as a float."""
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in {text[:80]}"))

    with h5py.File(method_results[method], "r") as f:
        checked = 0
        for obj in [f, f["provenance"], f["configs/000"], f["configs/001"]]:
            for v in obj.attrs.values():
                v = v.decode() if isinstance(v, bytes) else v
                if isinstance(v, str) and v[:1] and v[:1] in "[{":
                    strict(v)
                    checked += 1
        assert checked >= 2
        assert strict(f.attrs["sweep"]) == {"eps": [1.0, "Infinity"]}
    with open_result(method_results[method]) as r:
        assert r.sweep == {"eps": [1.0, math.inf]}
        assert np.all(np.isinf(r.configs[1].eps)) and len(r.configs[1].n) == len(r.configs[1].eps)


@pytest.mark.parametrize("method", METHODS)
def test_a_release_holds_only_what_the_guarantee_covers(method_results, method, tmp_path):
    """`mpi-dp export --release` of every method: no dataset marked evaluation-only, none of the
    reference optima, metrics computed on private records or listed attributes; the noisy models
    and the ledger stay, and xarray still reads named dimensions."""
    from mpi_dp.analysis import export
    from mpi_dp.results.schema import released

    out = tmp_path / f"{method}.release.h5"
    export.export_release(method_results[method], out)
    with h5py.File(method_results[method], "r") as raw, h5py.File(out, "r") as rel:
        assert rel.attrs["release"]
        kept = []

        def visit(name, o):
            if isinstance(o, h5py.Dataset):
                kept.append(name)
                assert o.attrs["evaluation_only"] == False, name  # noqa: E712 (numpy bool)
        rel.visititems(visit)
        for name in kept:
            if name.startswith("configs/"):
                assert released(name.split("/", 2)[2]), name
        for c in ("configs/000", "configs/001"):
            assert "reference" not in rel[c]
            for m in rel[c].get("metrics", {}):
                assert m in ("iteration", "step_size", "rho", "vectors_sent", "active_degree",
                             "a_self_min"), m
            hidden = strict_json.loads(raw[c].attrs["evaluation_only_attrs"])
            assert not set(hidden) & set(rel[c].attrs)
            assert "privacy/ledger" in rel[c] and "eps" in rel[c]
            assert rel[c]["privacy/ledger"][()].tobytes() == raw[c]["privacy/ledger"][()].tobytes()
        if method in ("sync_star", "async_star", "admm"):
            np.testing.assert_array_equal(rel["configs/000/models/final"][()],
                                          raw["configs/000/models/final"][()])
    ds = xr.open_dataset(out, engine="h5netcdf", group="configs/000")
    assert "agent" in ds.coords and not [d for d in ds.sizes if d.startswith("phony_dim")]
