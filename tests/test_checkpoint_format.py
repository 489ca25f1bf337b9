"""Checkpoints inside a configuration as plain HDF5 datasets (mpi_dp.results.checkpoint): every
state shape the methods produce comes back bit for bit (dtypes, shapes, key types, tuples vs
lists, the objects of the allow-list), and restored objects continue as the originals; a class
outside the allow-list is refused; an older checkpoint restarts its configuration from its start
(with a note) and still gives the uninterrupted run's results; no opaque byte blob is stored."""

from __future__ import annotations

import json
import math
import struct
import sys
import time
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
from helpers import mpi_run, read_datasets, write_job

from mpi_dp.comm.schedule import LoggedSchedule, Scheduler
from mpi_dp.privacy.contract import Plan, calibrate
from mpi_dp.privacy.events import LaplaceEvent, PureEvent
from mpi_dp.privacy.ledger import Ledger
from mpi_dp.privacy.noise_streams import RoundNoise
from mpi_dp.privacy.release import BlockRelease, OwnerRelease
from mpi_dp.results import checkpoint as ck
from mpi_dp.results.checkpoint import (
    CHECKPOINT_FORMAT_VERSION,
    CheckpointError,
    read_state,
    write_state,
)
from mpi_dp.results.recorder import ConfigRecorder
from mpi_dp.rng import agent_run_streams, run_streams

R = 3
OLD_NOTE = "checkpoint of an older format: configuration restarts from its start"


# -- exact comparison -----------------------------------------------------------------------------
def assert_same(a, b, where="state"):
    """a and b equal bit for bit: the same types (tuple vs list, numpy scalar vs Python number),
    dtypes, shapes, memory order, key types and order, and the objects' attributes."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape)
        assert a.tobytes() == b.tobytes(), where
        assert (a.flags.c_contiguous, a.flags.f_contiguous) == \
            (b.flags.c_contiguous, b.flags.f_contiguous) or not a.flags.contiguous, where
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), where
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), (where, a, b)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        ka, kb = list(a), list(b)
        assert_same(ka, kb, f"{where}.keys")
        for k in ka:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, np.random.Generator):
        assert a.bit_generator.state == b.bit_generator.state, where
    elif a is None or isinstance(a, bool | int | str):
        assert a == b, (where, a, b)
    else:
        skip = ck.ALLOWED[f"{type(a).__module__}.{type(a).__qualname__}"].transient
        va = {k: v for k, v in vars(a).items() if k not in skip}
        vb = {k: v for k, v in vars(b).items() if k not in skip}
        assert_same(va, vb, f"{where}<{type(a).__name__}>")


def round_trip(state, path, name="checkpoint"):
    with h5py.File(path, "w") as f:
        write_state(f.create_group(name), state)
    with h5py.File(path, "r") as f:
        return read_state(f[name])


# -- the states of the methods, from their own state() methods ------------------------------------
def ledger(agent: int, kind: str = "paper", charges: int = 3) -> Ledger:
    """A ledger as the methods leave it: a paper budget, a calibrated plan (configuration or
    record scope, a selection's context) or none, with a few releases charged."""
    if kind == "paper":
        led = OwnerRelease(agent, R, None, budget_eps=1.0, budget_delta=0.0).ledger
        ev = LaplaceEvent(0.05, 1.0 + agent)
    elif kind == "record":
        plan = Plan("laplace", 2, 1.0, 1e-5, scope="record")
        led = OwnerRelease(agent, R, calibrate(plan, "basic")).ledger
        ev = None
    else:
        fixed = (PureEvent(0.1, "warm_start"),)
        plan = Plan("gaussian", 10, 2.0, 1e-5, fixed=fixed)
        cal = calibrate(plan, "basic")
        led = OwnerRelease(agent, R, cal, allowance=12,
                           context=((cal.unit_event(), 1), (fixed[0], 1))).ledger
        ev = cal.event(0.5)
    for c in range(charges):
        if kind == "record":
            led.charge(LaplaceEvent(1.0, 4.0), record_pass=c % 2)
        else:
            led.charge(ev, runs=np.array([0, 2]) if c % 2 else None)
    return led


def _owner(cls, agent: int, **attrs):
    """An owner of `cls` (a Checkpointed class) holding `attrs` and a release path, as its
    __init__ leaves it after a few releases."""
    o = object.__new__(cls)
    o.agent = agent
    gens = run_streams(7, "noise", agent, range(R))
    gens.laplace(5 + agent)
    o.release = SimpleNamespace(ledger=ledger(agent, "calibrated" if agent % 2 else "paper"),
                                noise_position=gens.position)  # NOISE = None: the path's
    if cls.NOISE is not None:
        setattr(o, cls.NOISE, gens)
    for k, v in attrs.items():
        setattr(o, k, v)
    return o


def sync_star_state(n: int = 5) -> dict:
    from mpi_dp.algorithms.sync_star import DataOwner

    rng = np.random.default_rng(1)
    owners = [_owner(DataOwner, a, answered=12, last_clipped=rng.random(R)) for a in range(n)]
    return {"theta": rng.random((R, 4)), "theta_avg": rng.random((R, 4)), "step_sum": 0.37,
            "k": 12, "owners": dict((o.agent, o.state()) for o in owners)}


def admm_state(n: int = 5) -> dict:
    from mpi_dp.algorithms.admm import Agent

    rng = np.random.default_rng(2)
    agents = [_owner(Agent, a, z=rng.random((R, 3, 2)), lam=rng.random((R, 3, 2)),
                     noise_mag=rng.random(R), scale=rng.random(R), z_change=rng.random(R))
              for a in range(n)]
    return {"w": rng.random((R, 3, 2)), "k": 12, "owners": dict((o.agent, o.state())
                                                                 for o in agents)}


def async_star_state(schedule: str, n: int = 5) -> dict:
    from mpi_dp.algorithms.async_star import DataOwner, Trace, _Records

    rng = np.random.default_rng(3)
    owners = [_owner(DataOwner, a, clipped=rng.random(R)) for a in range(n)]
    if schedule == "logged":
        sched = LoggedSchedule(rng.integers(0, n, 40), np.arange(40.0), n, R)
    else:
        sched = Scheduler(schedule, n, 7, tuple(range(R)), rng.random(n) + 0.5)
    sched.next(np.arange(R))
    sched.remove(1, 2)
    sched.next(np.array([0, 1]))
    trace = Trace(R, 30)
    trace.served(1, np.arange(R), np.array([0, 1, 2]), np.array([0.0, 0.5, 1.5]),
                 rng.random((R, 4)))
    trace.declines += [(1, 3, 2, 0.25, 1), (0, 4, 1, 1.75, 2)] * 3
    trace.ended_at[2] = 7
    trace.end_reason = "every run ended"
    records = object.__new__(_Records)
    records.pending = [(k, rng.random((R, 4))) for k in (3, 6, 9, 12, 15)]
    records.last_psi, records.last_k = (None, 15) if schedule == "uniform" else (rng.random(R), 15)
    return {"k": 15, "alive": np.array([True, True, False]), "theta_L": rng.random((R, 4)),
            "theta_loc": rng.random((n, R, 4)), "sched": sched, "trace": trace,
            "records": records.state(), "owners": dict((o.agent, o.state()) for o in owners)}


def dola_state(k: int = 6) -> dict:
    from mpi_dp.algorithms import dola

    rng = np.random.default_rng(4)
    agents = np.arange(k)
    b = object.__new__(dola.Block)
    b.agents, b.t = agents, 9
    b.noise = RoundNoise(agent_run_streams(7, "noise", agents, tuple(range(R))), k, R, 4,
                         "laplace", rounds=30)  # a block release's round noise
    for _ in range(3):
        b.noise.next()
    b.Pub, b.W, b.Hsum = (rng.random((k, R, 4)) for _ in range(3))
    b.cum, b.noise_l1 = rng.random((4, k, R)), rng.random((k, R))
    b.last_active_deg, b.last_a_self = rng.random(k), rng.random(k)
    b.release = BlockRelease([OwnerRelease(int(a), R, None) for a in agents])
    for o in b.release.owners:
        o.ledger = ledger(o.agent, "record")
    b.net = SimpleNamespace(gather_objects=lambda obj: [obj])
    b._edge_idx = np.arange(7)
    b.activation = SimpleNamespace(last=rng.integers(-1, 9, 7))
    b.graph = SimpleNamespace(edges=np.zeros((7, 2), dtype=np.int64))
    return b.state()


def p2p_state(n: int = 6) -> dict:
    from mpi_dp.p2p import coordinate_descent

    rng = np.random.default_rng(5)
    b = object.__new__(coordinate_descent.Block)
    b.agents = np.arange(n)
    b.theta = {i: rng.random((R, 4)) for i in range(n)}
    b.k = {i: 3 + i for i in range(n)}
    b.clipped = {i: rng.random(R) for i in range(n)}
    b.release = {i: SimpleNamespace(ledger=ledger(i, "calibrated")) for i in range(n)}
    return {"round": 4, "puts": 57, "peers": b.state()}


def plain_values() -> dict:
    """Every plain value: numeric and bool dtypes (byte orders, 0-d, empty, Fortran order),
    numpy scalars, floats (NaN payload, -0.0, inf), big ints, keys of many types."""
    rng = np.random.default_rng(6)
    out: dict = {}
    for dt in ("?", "i1", "<i2", ">i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "<f8", ">f8",
               "c8", "c16"):
        base = (rng.standard_normal((3, 4)) * 50 + (1j if dt[-2:] in ("c8", "16") else 0))
        a = base.astype(dt)
        out[f"a{dt}"] = a
        out[f"F{dt}"] = np.asfortranarray(a)
        out[f"0d{dt}"] = np.array(a[1, 2])
        out[f"empty{dt}"] = np.zeros((2, 0), dtype=dt)
        out[f"s{dt}"] = a[2, 1]  # numpy scalar
    out["floats"] = [0.1, -0.0, math.inf, -math.inf, math.nan,
                     struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000ABC))[0], 5e-324]
    out["ints"] = (0, -1, 2**63 - 1, -(2**63), 2**63, 2**127 + 5, -(2**200) + 3, True, False)
    out["keys"] = {1: "int", "s": "str", (1, "a", 2.5): "tuple", np.int64(4): "np",
                   None: "none", 2.5: "float", False: "bool"}
    out["nested"] = [(1, [2, (3,)]), [], (), {}, None, "", [[]]]
    return out


def stacked_values() -> dict:
    """Containers the format stacks: many entries of one template, entries of a few templates
    (positions kept), ints beyond int64 in stacked entries, numpy and tuple keys."""
    rng = np.random.default_rng(7)
    return {
        "same": {a: {"x": rng.random(3), "k": a, "f": a / 7, "b": a % 2 == 0,
                     "n": np.float64(a), "big": 2**100 + a} for a in range(20)},
        "mixed": {a: ({"x": rng.random(2)} if a % 3 else {"x": rng.random(5), "y": None})
                  for a in range(12)},
        "tuples": [(int(r), int(k), float(t), 1) for r, k, t in rng.random((30, 3)) * 100],
        "np_keys": {np.int64(a): np.float32(a) for a in range(8)},
        "tuple_keys": {(a, "x"): [a, (a,)] for a in range(8)},
        "distinct": [[0] * a for a in range(10)],  # no two alike: stored entry by entry
        "negative_big": [-(2**90) - a for a in range(6)],
    }


STATES = {
    "plain": plain_values,
    "stacked": stacked_values,
    "sync_star": sync_star_state,
    "admm": admm_state,
    "async_star_poisson": lambda: async_star_state("poisson"),
    "async_star_uniform": lambda: async_star_state("uniform"),
    "async_star_logged": lambda: async_star_state("logged"),
    "dola": dola_state,
    "p2p": p2p_state,
    "many_owners": lambda: sync_star_state(60),
}


@pytest.mark.parametrize("name", sorted(STATES))
def test_every_state_shape_round_trips_bit_for_bit(tmp_path, name):
    state = STATES[name]()
    back = round_trip(state, tmp_path / "c.h5")
    assert_same(state, back)
    # and again from what was read (nothing the first read made differs when written anew)
    assert_same(state, round_trip(back, tmp_path / "d.h5"))


def test_restored_objects_continue_as_the_originals(tmp_path):
    """The noise streams, schedules and ledgers of a restored state draw, serve and charge
    exactly as the originals do from the same point (and refuse the same release)."""
    for schedule in ("poisson", "uniform", "logged"):
        st = async_star_state(schedule)
        back = round_trip(st, tmp_path / f"{schedule}.h5")
        if schedule == "poisson":
            assert all(b.gen is g for b, g in zip(back["sched"]._exp, back["sched"].gens,
                                                  strict=True))
        for _ in range(5):
            a, b = st["sched"].next(np.arange(R)), back["sched"].next(np.arange(R))
            assert_same(a, b)
    st = sync_star_state()
    back = round_trip(st, tmp_path / "s.h5")
    for a in st["owners"]:
        g1, g2 = run_streams(7, "noise", a, range(R)), run_streams(7, "noise", a, range(R))
        g1.seek(st["owners"][a]["noise"])
        g2.seek(back["owners"][a]["noise"])
        assert g1.laplace(9).tobytes() == g2.laplace(9).tobytes()
    for kind in ("paper", "calibrated", "record"):
        led = ledger(3, kind, charges=2)
        led2 = round_trip({"l": led}, tmp_path / f"{kind}.h5")["l"]
        assert led2._last is None
        ev = (LaplaceEvent(1.0, 4.0) if kind == "record" else led.target.event(0.5)
              if kind == "calibrated" else LaplaceEvent(0.05, 0.5))
        outcomes = []
        for lg in (led, led2):
            got = []
            for c in range(40):
                try:
                    lg.charge(ev, record_pass=c if kind == "record" else None)
                    got.append("ok")
                except Exception as e:  # noqa: BLE001 - the refusal, compared
                    got.append(f"{type(e).__name__}: {e}")
            outcomes.append((got, lg.spent_eps.tobytes(), lg.releases.tobytes(),
                             repr(lg.scope_pairs())))
        assert outcomes[0] == outcomes[1]
        assert any(g != "ok" for g in outcomes[0][0])  # it did refuse


def test_many_owners_are_stacked_not_stored_one_by_one(tmp_path):
    """10^4 owners each {z, lam, noise position, ledger} share one dataset per leaf (no group or
    dataset per owner), written and read in well under a few seconds."""
    n = 10_000
    rng = np.random.default_rng(8)
    base = ledger(0, "paper")
    h, lo = run_streams(7, "noise", 0, range(2)).position()
    owners = {}
    for a in range(n):
        led = object.__new__(Ledger)
        led.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                             for k, v in vars(base).items()})
        led.agent = a
        owners[a] = {"z": rng.random((2, 5)), "lam": rng.random((2, 5)),
                     "noise": (h + a, lo.copy()), "ledger": led}
    state = {"k": 12, "owners": owners}
    path = tmp_path / "c.h5"
    t0 = time.process_time()  # CPU time: what the format costs, whatever else the machine runs
    with h5py.File(path, "w") as f:
        write_state(f.create_group("checkpoint"), state)
    t1 = time.process_time()
    with h5py.File(path, "r") as f:
        g = f["checkpoint"]
        assert len(g) < 40 and all(isinstance(x, h5py.Dataset) for x in g.values())
        back = read_state(g)
    t2 = time.process_time()
    print(f"\n{n} owners: write {t1 - t0:.2f} s, read {t2 - t1:.2f} s (CPU)", file=sys.stderr)
    assert t2 - t0 < 5.0
    for a in (0, 1, 4567, n - 1):
        assert_same(owners[a], back["owners"][a])
    assert list(back["owners"]) == list(owners)


# -- refusals -------------------------------------------------------------------------------------
class NotAllowed:
    def __init__(self) -> None:
        self.x = 1


def _reseal(group: h5py.Group, context: str = "") -> None:
    """Give an edited checkpoint the digest of what it now holds: the checks behind the digest
    (a class outside the allow-list, a malformed tree) still refuse it."""
    hashes = {k: ck._dataset_hash(k, group[k][...]) for k in group if k != "structure"}
    group.attrs["digest"] = ck._digest(context, group["structure"][()], hashes)


def _retag(path, old: str, new: str) -> None:
    with h5py.File(path, "r+") as f:
        text = f["checkpoint/structure"][()].decode()
        assert old in text
        del f["checkpoint/structure"]
        f["checkpoint"].create_dataset("structure", data=text.replace(old, new),
                                       dtype=h5py.string_dtype())
        _reseal(f["checkpoint"])


@pytest.mark.parametrize("stacked", [False, True])
def test_a_class_outside_the_allow_list_is_refused(tmp_path, stacked):
    """Writing an object of a class not allowed fails; a file naming such a class (here in the
    place of an allowed one) is refused without importing anything it names."""
    with pytest.raises(CheckpointError, match="NotAllowed"), h5py.File(tmp_path / "w.h5", "w") as f:
        write_state(f.create_group("checkpoint"), {"o": NotAllowed()})
    with pytest.raises(CheckpointError, match="object"), h5py.File(tmp_path / "w.h5", "w") as f:
        write_state(f.create_group("checkpoint"), {"o": np.array([None], dtype=object)})
    path = tmp_path / "c.h5"
    events = [LaplaceEvent(0.1, 1.0 + i) for i in range(8 if stacked else 1)]
    with h5py.File(path, "w") as f:
        write_state(f.create_group("checkpoint"), {"events": events})
    for name in ("os._wrap_close", "subprocess.Popen", "mpi_dp_not_a_module.Thing",
                 "mpi_dp.results.recorder.ResultFile"):
        _retag(path, "mpi_dp.privacy.events.LaplaceEvent", name)
        with h5py.File(path, "r") as f, pytest.raises(CheckpointError, match="not among"):
            read_state(f["checkpoint"])
        assert "mpi_dp_not_a_module" not in sys.modules
        _retag(path, name, "mpi_dp.privacy.events.LaplaceEvent")
    with h5py.File(path, "r") as f:
        assert_same(events, read_state(f["checkpoint"])["events"])


def test_every_allowed_class_is_where_its_name_says():
    """A checkpoint stores a class by module.qualname: every name of the allow-list still names
    its class, where it is now (a class moved to another module needs its old name read as the
    new one, for the checkpoints written before the move)."""
    for name, spec in ck.ALLOWED.items():
        cls = ck._class(name)
        assert f"{cls.__module__}.{cls.__qualname__}" == name == f"{spec.module}.{spec.qualname}"


def test_a_checkpoint_of_another_format_version_or_damaged_is_refused(tmp_path):
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        write_state(f.create_group("checkpoint"), {"k": 1})
        assert f["checkpoint"].attrs["format_version"] == CHECKPOINT_FORMAT_VERSION
        f["checkpoint"].attrs["format_version"] = CHECKPOINT_FORMAT_VERSION + 1
        with pytest.raises(CheckpointError, match="format version"):
            read_state(f["checkpoint"])
        # a damaged tree is refused the same way (a resume then restarts the configuration)
        f["checkpoint"].attrs["format_version"] = CHECKPOINT_FORMAT_VERSION
        for text in ('["d",[[["s","k"]]]]', '["a","d7","<f8","C"]', '["q"]', "[1"):
            del f["checkpoint/structure"]
            f["checkpoint"].create_dataset("structure", data=text, dtype=h5py.string_dtype())
            _reseal(f["checkpoint"])
            with pytest.raises(CheckpointError, match="malformed"):
                read_state(f["checkpoint"])


# -- the recorder: old checkpoints, a write that does not finish ----------------------------------
def _recorder_with_records(f: h5py.File, n: int) -> ConfigRecorder:
    rec = ConfigRecorder(f.require_group("configs/000"), runs=R)
    for k in range(n):
        rec.append(k, {"psi": np.full(R, float(k)), "step_size": 0.1 * k})
    return rec


@pytest.mark.parametrize("old", ["pickled_blob", "other_version", "unfinished"])
def test_an_older_checkpoint_restarts_its_configuration_from_the_start(tmp_path, capsys, old):
    """The uint8 dataset of earlier versions (never unpickled), a group of another format
    version or one never marked complete: one note on stderr, no saved state, the
    configuration's records dropped, the checkpoint removed."""
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        rec = _recorder_with_records(f, 4)
        g = rec.group
        if old == "pickled_blob":
            ds = g.create_dataset("checkpoint", data=np.frombuffer(b"\x80\x05K\x01.", np.uint8))
            ds.attrs["n_records"] = 2
        else:
            rec.save_state({"k": 3})
            if old == "other_version":
                g["checkpoint"].attrs["format_version"] = 0
            else:
                del g["checkpoint"].attrs["complete"]
    with h5py.File(path, "r+") as f:
        rec = ConfigRecorder(f["configs/000"], runs=R)
        rec.resume_from_checkpoint()
        assert rec.saved_state() is None and rec.n_records == 0
        assert len(rec.metrics) == 0 and "checkpoint" not in rec.group
    err = capsys.readouterr().err
    assert err.count(OLD_NOTE) == 1 and len(err.strip().splitlines()) == 1, err


def test_a_write_that_does_not_finish_leaves_the_previous_checkpoint(tmp_path):
    """A state that fails half way (a value the format does not hold, after arrays were written)
    leaves the previous checkpoint whole; the resume continues from it."""
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        rec = _recorder_with_records(f, 2)
        first = sync_star_state()
        rec.save_state(first)
        rec.append(2, {"psi": np.full(R, 2.0), "step_size": 0.2})
        with pytest.raises(CheckpointError):
            rec.save_state({"theta": np.ones(3), "owners": {0: NotAllowed()}})
        assert "checkpoint_new" in rec.group and "complete" not in rec.group["checkpoint_new"].attrs
        g = rec.group["checkpoint"]
        assert g.attrs["n_records"] == 2 and g.attrs["complete"]
    with h5py.File(path, "r+") as f:
        rec = ConfigRecorder(f["configs/000"], runs=R)
        rec.resume_from_checkpoint()
        assert rec.n_records == 2 and rec.metrics["psi"].shape == (2, R)
        assert_same(first, rec.saved_state())
        rec.save_state({"k": 5})  # the next checkpoint replaces both
        assert "checkpoint_new" not in rec.group
        assert read_state(rec.group["checkpoint"], rec.checkpoint_context(2)) == {"k": 5}


def _uint8_datasets(f: h5py.File) -> list[str]:
    out: list[str] = []
    f.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset)
                 and obj.dtype == np.uint8 else None)
    return out


def test_a_resume_from_an_older_checkpoint_restarts_and_gives_the_same_results(tmp_path,
                                                                               small_shards):
    """A real checkpoint (writer SIGKILLed at record 6 of configuration 1, a checkpoint at every
    record) is a group of plain datasets, no uint8 blob in the file; replaced by an old-format
    (pickled uint8) checkpoint, `run --resume` notes it, restarts that configuration from its
    start and gives every dataset of the uninterrupted run, byte for byte."""
    from mpi_dp.results.output import partial_path

    job = write_job(tmp_path / "c.toml", small_shards, T=30, runs=3, record_every=3,
                    sweep={"eps": [0.5, 2.0]})
    whole, cut = tmp_path / "whole.h5", tmp_path / "cut.h5"
    cp = mpi_run(2, ["run", str(job), "--out", str(whole), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    cp = mpi_run(2, ["run", str(job), "--out", str(cut), "--quiet"],
                 env={"MPI_DP_TEST_KILL_AT": "1:6", "MPI_DP_CHECKPOINT_S": "0"})
    assert cp.returncode != 0 and not cut.exists()
    with h5py.File(partial_path(cut), "r+", locking=False) as f:
        g = f["configs/001/checkpoint"]
        assert isinstance(g, h5py.Group) and g.attrs["complete"]
        assert g.attrs["format_version"] == CHECKPOINT_FORMAT_VERSION
        assert g.attrs["n_records"] == 5
        assert _uint8_datasets(f) == []
        tree = json.loads(g["structure"][()])
        assert tree[0] == "d" and [["s", "k"], ["i", 12]] in tree[1]
        del f["configs/001/checkpoint"]
        old = f["configs/001"].create_dataset("checkpoint", data=np.frombuffer(
            b"\x80\x05\x95 not a state", dtype=np.uint8))
        old.attrs["n_records"] = 5
    cp = mpi_run(2, ["run", str(job), "--out", str(cut), "--resume"],
                 env={"MPI_DP_CHECKPOINT_S": "0"})
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr.count(OLD_NOTE) == 1, cp.stderr
    assert "resumed from its checkpoint" not in cp.stderr
    a, b = read_datasets(whole), read_datasets(cut)
    assert sorted(a) == sorted(b) and not any("checkpoint" in k for k in b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
