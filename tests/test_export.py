"""`mpi-dp export`: tidy tables that pandas reads back exactly, and a release file that keeps only
what the privacy guarantee covers; the CLI's -v/--quiet levels and analyze's sharing note."""

from __future__ import annotations

import json
import math
import shutil
import sys

import h5py
import numpy as np
import pandas as pd
import pytest
from helpers import mpi_run, write_job

from mpi_dp import cli, strict_json
from mpi_dp.analysis import export
from mpi_dp.analysis.load import open_result


@pytest.fixture(scope="module")
def results(tmp_path_factory, small_shards, method_shards) -> dict:
    """Two real results: a swept sync_star job under mpiexec -n 2 (configs/000, 001; a
    per-iteration metric, step_size) and one configuration of dola on one rank (G = /)."""
    from mpi_dp.runner import run_job

    d = tmp_path_factory.mktemp("export")
    sweep = write_job(d / "sweep.toml", small_shards, T=6, runs=3, record_every=2,
                      sweep={"eps": [1.0, math.inf]})
    cp = mpi_run(2, ["run", str(sweep), "--out", str(d / "sweep.h5"), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    dola = write_job(d / "dola.toml", method_shards["online"], algorithm="dola", T=6, runs=2,
                     record_every=2, seed=5, dola={"graph": "medium"})
    return {"sweep": d / "sweep.h5", "dola": run_job(dola, progress=False)}


def _copy(src, tmp_path, name="r.h5"):
    dst = tmp_path / name
    shutil.copyfile(src, dst)
    return dst


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _groups(f: h5py.File) -> list[tuple[int, h5py.Group]]:
    if "configs" in f:
        return [(int(g.attrs["config_index"]), g) for _, g in sorted(f["configs"].items())]
    return [(int(f.attrs.get("config_index", 0)), f)]


def _bits_equal(got, want) -> bool:
    """Same float64 values bit for bit (NaN: at the same places)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(got), nan)
                and np.array_equal(got[~nan].view(np.int64), want[~nan].view(np.int64)))


def _cell_equal(cell, attr) -> bool:
    """A configuration column's cell read back against the group attribute."""
    if isinstance(attr, bytes | np.bytes_):
        attr = attr.decode()
    if isinstance(attr, np.generic):
        attr = attr.item()
    if isinstance(attr, bool):
        return bool(cell) == attr
    if isinstance(attr, int | float):
        return _bits_equal(float(cell), float(attr))
    return str(cell) == attr


def _column(df: pd.DataFrame, name: str) -> str:
    """A configuration column's name in the table (config.<name> where it clashes)."""
    return name if name in df.columns and name not in export.RESERVED else \
        export.CLASH_PREFIX + name


def _read(path, fmt):
    return pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)


def _check_tables(result, metrics_path, ledger_path, fmt) -> None:
    m, led = _read(metrics_path, fmt), _read(ledger_path, fmt)
    with open_result(result) as res:  # the sweep as the reader parses it (strict JSON)
        sweep = res.sweep
    with h5py.File(result, "r") as f:
        groups = _groups(f)
        assert sorted(m["config"].unique()) == [i for i, _ in groups]
        for i, g in groups:
            rows = m[m["config"] == i]
            its = g["metrics/iteration"][()]
            runs = int(g.attrs["runs"])
            assert len(rows) == len(its) * runs
            assert np.array_equal(rows["iteration"].to_numpy().reshape(-1, runs)[:, 0], its)
            run_ids = g["run"][()] if isinstance(g.get("run"), h5py.Dataset) else \
                g.attrs.get("run_ids", np.arange(runs))  # format 2: the `run` coordinate
            assert np.array_equal(rows["run"].to_numpy().reshape(-1, runs)[0], run_ids)
            names = [k for k in g["metrics"] if k != "iteration"]
            assert names and set(names) <= set(m.columns)
            for k in names:
                d = g["metrics"][k][()]
                got = rows[k].to_numpy(dtype=np.float64).reshape(-1, runs)
                if d.ndim == 1:  # a per-iteration scalar repeats over the runs
                    assert all(_bits_equal(got[:, r], d) for r in range(runs)), k
                else:
                    assert _bits_equal(got, d), k
            # the configuration's columns: its scalar attributes, the same in both tables
            scalars = {k: v for k, v in g.attrs.items() if k not in ("config_index",
                                                                    "sweep_values")
                       and (not isinstance(v, np.ndarray) or v.shape == ())}
            assert scalars
            lrows = led[led["config"] == i]
            for k, v in scalars.items():
                col = _column(m, k)
                assert col in m.columns and col in led.columns, k
                assert all(_cell_equal(c, v) for c in rows[col]), (k, v, rows[col].iloc[0])
                assert all(_cell_equal(c, v) for c in lrows[col]), k
            for k, values in sweep.items():  # the swept value of this configuration
                assert all(_cell_equal(c, values[i]) for c in rows[k]), k
            if "sweep_values" in g.attrs:  # format 2: the configuration says its own values
                own = strict_json.loads(g.attrs["sweep_values"])
                assert set(own) == set(sweep) and "sweep_values" not in m.columns
                for k, v in own.items():
                    assert all(_cell_equal(c, v) for c in rows[k]), k
            # per-agent values (attributes or, format 2, datasets) are no columns
            per_agent = [k for k, v in g.attrs.items() if isinstance(v, np.ndarray) and v.shape]
            per_agent += [k for k, v in g.items() if isinstance(v, h5py.Dataset)
                          and v.attrs.get("per_agent", False)]
            assert "n" in per_agent and not set(per_agent) & (set(m.columns) - set(sweep))
            # the ledger: one row per agent, every field
            table = g["privacy/ledger"][()]
            assert len(lrows) == len(table)
            for field in table.dtype.names:
                want, got = table[field], lrows[field].to_numpy()
                if want.dtype.kind == "S":
                    assert [str(x) for x in got] == [x.decode() for x in want], field
                elif want.dtype.kind == "f":
                    assert _bits_equal(got, want), field
                else:
                    assert np.array_equal(got.astype(want.dtype), want), field


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("which", ["sweep", "dola"])
def test_tables_round_trip_exactly(results, tmp_path, capsys, which, fmt):
    src = _copy(results[which], tmp_path)
    args = ["export", str(src)] + (["--format", fmt] if fmt != "csv" else [])
    rc, out, err = _cli(capsys, *args)
    assert rc == 0, err
    metrics, ledger = tmp_path / f"r.{fmt}", tmp_path / f"r.ledger.{fmt}"
    assert out.split() == ["metrics:", str(metrics), "ledger:", str(ledger)]
    _check_tables(src, metrics, ledger, fmt)


def test_nan_inf_and_signed_zero_survive_csv(results, tmp_path, capsys):
    src = _copy(results["sweep"], tmp_path)
    special = [math.nan, math.inf, -math.inf, -0.0, 5e-324, 0.1, 1 / 3, 1.7976931348623157e308]
    with h5py.File(src, "r+") as f:
        d = f["configs/000/metrics/psi"]
        flat = d[()].reshape(-1)
        flat[: len(special)] = special
        d[...] = flat.reshape(d.shape)
    out = tmp_path / "t" / "m.csv"
    rc, _, err = _cli(capsys, "export", str(src), "--out", str(out))
    assert rc == 0, err
    assert (tmp_path / "t" / "m.ledger.csv").is_file()
    _check_tables(src, out, tmp_path / "t" / "m.ledger.csv", "csv")
    got = pd.read_csv(out)["psi"].to_numpy()[: len(special)]
    assert _bits_equal(got, special)


def test_existing_outputs_are_replaced_only_with_overwrite(results, tmp_path, capsys):
    src = _copy(results["sweep"], tmp_path)
    assert _cli(capsys, "export", str(src))[0] == 0
    ledger = tmp_path / "r.ledger.csv"
    ledger.write_text("mine\n")
    rc, out, err = _cli(capsys, "export", str(src))
    assert rc == 2 and "--overwrite" in err and str(ledger) in err and not out
    assert ledger.read_text() == "mine\n"
    rc, _, err = _cli(capsys, "export", str(src), "--release")
    assert rc == 0, err
    rc, _, err = _cli(capsys, "export", str(src), "--release")
    assert rc == 2 and "--overwrite" in err
    rc, _, err = _cli(capsys, "export", str(src), "--out", str(src), "--overwrite")
    assert rc == 2 and "the result file itself" in err
    assert _cli(capsys, "export", str(src), "--overwrite")[0] == 0
    assert ledger.read_text() != "mine\n"
    assert not list(tmp_path.glob(".*tmp-*"))


def test_parquet_without_pyarrow_names_the_install(results, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    rc, _, err = _cli(capsys, "export", str(results["sweep"]), "--format", "parquet",
                      "--out", str(tmp_path / "m.parquet"))
    assert rc == 2 and "pip install pyarrow" in err and "mpi_dp[export]" in err
    assert not list(tmp_path.iterdir())


# -- release --------------------------------------------------------------------------------------

def _ds(g, name, data, flag="missing", **attrs):
    d = g.create_dataset(name, data=data)
    if flag != "missing":
        d.attrs["evaluation_only"] = flag
    for k, v in attrs.items():
        d.attrs[k] = v
    return d


def _ledger(n: int, eps: float) -> np.ndarray:
    """A ledger whose guarantee is finite and certified: n owners, 3 Laplace releases each,
    calibrated to (eps, 1e-5)."""
    from mpi_dp.privacy.accountants import LEDGER_DTYPE

    led = np.zeros(n, dtype=LEDGER_DTYPE)
    led["agent"] = np.arange(n)
    led["mechanism"], led["releases"], led["eps_per_release"] = b"laplace", 3, eps / 3
    led["target_eps"], led["target_delta"], led["delta"] = eps, 1e-5, 1e-5
    led["calibration"], led["scope"], led["certified"] = b"pld", b"configuration", True
    for k in ("eps_basic", "eps_advanced", "eps_pld", "eps_rdp", "eps_basic_all", "eps_pld_all",
              "eps_rdp_all"):
        led[k] = eps * (0.99 if "pld" in k else 1.0)
    return led


def _synthetic(path, status="complete"):
    """A result-like file: released (evaluation_only False), evaluation-only (True) and unmarked
    datasets, an evaluation_only_attrs list, attributes kept as datasets, dimension scales."""
    with h5py.File(path, "w") as f:
        a = f.attrs
        a.update(format="mpi_dp.results", format_version=1, job="name = 'x'\n",
                 job_resolved='{"T": 3}', algorithm="sync_star", variant="alg2", status=status,
                 n_configs=2, sweep=json.dumps({"eps": [1.0, 2.0]}))
        f.create_group("provenance").attrs.update(seed=7, hosts='["h"]')
        for i in range(2):
            g = f.create_group(f"configs/{i:03d}")
            g.attrs.update(config_index=i, label=f"eps={i + 1}", T=3, runs=2,
                           eps=np.array([1.0 + i, 1.0 + i]), train_mse_star=0.25,
                           secret_count=11, evaluation_only_attrs='["train_mse_star", '
                           '"secret_count", "n_private"]')
            arr = g.create_group("arrays")
            arr.attrs["doc"] = "long attributes"
            _ds(arr, "n", np.arange(3))
            _ds(arr, "n_private", np.arange(3))
            m = g.create_group("metrics")
            it = _ds(m, "iteration", np.arange(4), False)
            it.make_scale("iteration")
            run = _ds(m, "run", np.arange(2), False)
            run.make_scale("run")
            hidden = _ds(m, "hidden_scale", np.arange(2))  # unmarked: not released
            hidden.make_scale("hidden_scale")
            noise = _ds(m, "noise_l1", np.full((4, 2), 0.5 + i), False, what="noise")
            psi = _ds(m, "psi", np.ones((4, 2)), True)
            mixed = _ds(m, "mixed", np.zeros((4, 2)), False)
            for ds in (noise, psi):
                ds.dims[0].attach_scale(it)
                ds.dims[1].attach_scale(run)
            mixed.dims[0].attach_scale(it)
            mixed.dims[1].attach_scale(hidden)
            _ds(m, "step_size", np.ones(4))  # unmarked
            _ds(g, "models/final", np.ones((2, 3)), False)
            _ds(g, "models/final_iterate", np.ones((2, 3)))
            _ds(g, "reference/theta_star", np.ones(3), True)
            _ds(g, "reference/f_star", 1.5, "False")  # not a boolean: not released
            _ds(g, "privacy/ledger", _ledger(2, 1.0 + i), np.False_, guarantee="(eps, delta)-DP")
            _ds(g, "privacy/clip_fraction", np.zeros(2), np.True_)
    return path


def _datasets(path) -> dict:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset)
                     else None)
    return out


def test_release_keeps_exactly_what_the_guarantee_covers(tmp_path, capsys):
    src = _synthetic(tmp_path / "s.h5")
    rc, out, err = _cli(capsys, "export", str(src), "--release")
    assert rc == 0, err
    rel = tmp_path / "s.release.h5"
    assert f"release: {rel}" in out
    kept = {"metrics/iteration", "metrics/run", "metrics/noise_l1", "metrics/mixed",
            "models/final", "privacy/ledger", "arrays/n"}
    want = {f"configs/{i:03d}/{k}" for i in range(2) for k in kept}
    got, before = _datasets(rel), _datasets(src)
    # and in place of the unreleased scale of a released axis: its name and length, no values
    dims_only = {f"configs/{i:03d}/metrics/hidden_scale" for i in range(2)}
    assert set(got) == want | dims_only
    assert all(not got[k].any() for k in dims_only)
    for k in want:
        assert got[k].tobytes() == before[k].tobytes() and got[k].dtype == before[k].dtype, k
    with h5py.File(src, "r") as s, h5py.File(rel, "r") as r:
        for k, v in s.attrs.items():
            assert np.array_equal(r.attrs[k], v), k
        assert r.attrs["release"] == True  # noqa: E712 - a numpy bool
        note = r.attrs["release_note"]
        assert "evaluation-only values computed from private records without noise" in note
        removed = json.loads(r.attrs["release_removed"])
        assert "/configs/000/metrics/psi" in removed["datasets"]
        assert "/configs/001:secret_count" in removed["attrs"]
        assert dict(r["provenance"].attrs) == dict(s["provenance"].attrs)
        for i in range(2):
            g, sg = r[f"configs/{i:03d}"], s[f"configs/{i:03d}"]
            assert set(g.attrs) == set(sg.attrs) - {"train_mse_star", "secret_count"}
            assert g.attrs["label"] == f"eps={i + 1}" and list(g.attrs["eps"]) == [1.0 + i] * 2
            assert "reference" not in g  # nothing of it released: the group goes too
            m = g["metrics"]
            assert m["noise_l1"].attrs["what"] == "noise"
            assert not m["noise_l1"].attrs["evaluation_only"]
            assert m["iteration"].is_scale and m["run"].is_scale
            assert [d.label for d in m["noise_l1"].dims] == ["", ""]
            assert m["noise_l1"].dims[0][0] == m["iteration"]
            assert m["noise_l1"].dims[1][0] == m["run"]
            assert m["mixed"].dims[0][0] == m["iteration"]
            hidden = m["mixed"].dims[1][0]  # its scale was not released: a dimension only
            assert hidden.name == m["hidden_scale"].name and hidden.shape == (2,)
            assert export.NOT_A_VARIABLE in hidden.attrs["NAME"].decode()
            assert not m["noise_l1"].is_scale and "DIMENSION_LIST" not in g["models/final"].attrs


def test_release_reads_with_xarray_dimension_names(tmp_path, capsys):
    xr = pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    src = _synthetic(tmp_path / "s.h5")
    assert _cli(capsys, "export", str(src), "--release")[0] == 0
    ds = xr.open_dataset(tmp_path / "s.release.h5", engine="h5netcdf",
                         group="configs/000/metrics", phony_dims="sort")
    assert ds["noise_l1"].dims == ("iteration", "run")
    assert float(ds["noise_l1"][0, 0]) == 0.5
    assert ds["mixed"].dims == ("iteration", "hidden_scale")  # the name, without values
    assert "hidden_scale" not in ds.variables and "psi" not in ds.variables
    ds.close()


def test_release_of_an_unfinished_result_needs_force(tmp_path, capsys):
    src = _synthetic(tmp_path / "s.h5", status="running")
    rc, out, err = _cli(capsys, "export", str(src), "--release")
    assert rc == 2 and "'running'" in err and "--force" in err
    assert not (tmp_path / "s.release.h5").exists()
    rc, out, err = _cli(capsys, "export", str(src), "--release", "--force",
                        "--out", str(tmp_path / "shared.h5"))
    assert rc == 0, err
    with h5py.File(tmp_path / "shared.h5", "r") as f:
        assert f.attrs["status"] == "running" and f.attrs["release"]


def test_a_malformed_evaluation_only_attrs_writes_nothing(tmp_path, capsys):
    src = _synthetic(tmp_path / "s.h5")
    with h5py.File(src, "r+") as f:
        f["configs/001"].attrs["evaluation_only_attrs"] = "train_mse_star"
    rc, _, err = _cli(capsys, "export", str(src), "--release")
    assert rc == 2 and "evaluation_only_attrs" in err
    assert not (tmp_path / "s.release.h5").exists() and not list(tmp_path.glob(".*tmp-*"))


def test_a_real_result_releases_its_marked_datasets_only(results, tmp_path, capsys):
    """Every dataset marked evaluation_only = false of the eps = 1 configuration; of the
    eps = inf one (trained without noise) only its ledger, target eps and agent coordinate."""
    src = _copy(results["sweep"], tmp_path)
    assert _cli(capsys, "export", str(src), "--release")[0] == 0
    with h5py.File(src, "r") as s:
        marked = set()
        s.visititems(lambda n, o: marked.add(n) if isinstance(o, h5py.Dataset)
                     and export.released(o) else None)
    guarantee = {k for k in marked if k.startswith("configs/001/") and k.split("/", 2)[2] in (
        "privacy/ledger", "eps", "agent") or k.startswith("configs/001/ledger/")}
    no_noise = {k for k in marked if k.startswith("configs/001/")} - guarantee
    assert "configs/001/models/final" in no_noise and "configs/001/ledger/eps_pld" in guarantee
    assert set(_datasets(tmp_path / "r.release.h5")) == marked - no_noise
    assert not any(k.startswith(("configs/000/reference", "reference")) for k in marked)


# -- help, analyze, verbosity ---------------------------------------------------------------------

def test_export_help_teaches_the_tables_pandas_and_the_release(capsys):
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    text = capsys.readouterr().out
    for piece in ("one row per (configuration, iteration, run)", "one row per (configuration, "
                  "agent)", "pd.read_csv", "pd.read_parquet", "evaluation_only_attrs",
                  "not safe to share", "--release", "--overwrite"):
        assert piece in " ".join(text.split()), piece


def test_analyze_ends_with_the_sharing_note(results, capsys):
    rc, out, err = _cli(capsys, "analyze", str(results["sweep"]))
    assert rc == 0, err
    last = out.strip().splitlines()[-1]
    assert "evaluation-only values computed from private records without noise" in last
    assert "not safe to share" in last and "mpi-dp export --release" in last


@pytest.mark.parametrize("argv, level", [
    (["run", "j.toml"], 0), (["run", "j.toml", "--quiet"], -1), (["run", "j.toml", "-v"], 1),
    (["run", "j.toml", "--verbose"], 1), (["audit", "j.toml", "-v"], 1),
    (["merge", "o.h5", "--quiet"], -1), (["info"], 0)])
def test_verbosity_levels(argv, level):
    assert cli._verbosity(cli.build_parser().parse_args(argv)) == level


def test_quiet_and_verbose_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "j.toml", "--quiet", "-v"])
    assert "not allowed with" in capsys.readouterr().err


def test_main_configures_the_progress_log_first(monkeypatch, capsys):
    import mpi_dp.progress as progress

    seen = []
    monkeypatch.setattr(progress, "configure", seen.append)
    assert cli.main(["info"]) == 0
    assert seen == [0]


def test_a_format_1_file_gets_its_sweep_expanded_from_the_root(tmp_path):
    """Files written before the per-configuration `sweep_values` (format 1): the root sweep is
    expanded in the job's order and checked against the configurations' own attributes."""
    src = _synthetic(tmp_path / "s.h5")
    with open_result(src) as res:
        assert export.sweep_values(res) == {0: {"eps": 1.0}, 1: {"eps": 2.0}}
    with h5py.File(src, "r+") as f:  # the same file, but its configurations say their values
        for i in range(2):
            f[f"configs/{i:03d}"].attrs["sweep_values"] = strict_json.dumps({"eps": 5.0 + i})
    with open_result(src) as res:
        assert export.sweep_values(res) == {0: {"eps": 5.0}, 1: {"eps": 6.0}}
