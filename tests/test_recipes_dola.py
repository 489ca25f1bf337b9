"""Seed 003 (DOLA) recipes on the real copies in ../shared/data: diabetes and mnist_parity.

Labels and kept rows are recomputed here straight from the source files (zipfile + csv, numpy on
the IDX labels), independently of the recipe code.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mpi_dp.data import ShardFile, readers, recipes
from mpi_dp.data.prepare import describe, write_prepared

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (real data copies) absent")

DIABETES_ROWS = 101_766
DROPPED_COLUMNS = ("weight", "payer_code", "medical_specialty")


def build(name: str, **opts):
    r = recipes.get(name)
    return r.build(recipes.resolve_files(r, [SHARED]), recipes.options(r, opts))


def row_norms(X: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->i", X, X))


@pytest.fixture(scope="module")
def diabetes():
    return build("diabetes")


@pytest.fixture(scope="module")
def raw_diabetes() -> list[dict[str, str]]:
    """diabetic_data.csv as dicts of strings, read here without the recipe's reader."""
    with zipfile.ZipFile(SHARED / "diabetes130" / "dataset_diabetes.zip") as zf:
        text = zf.read("dataset_diabetes/diabetic_data.csv").decode("utf-8")
    return list(csv.DictReader(io.StringIO(text, newline="")))


def test_diabetes_rows_columns_and_norms(diabetes, raw_diabetes):
    p = diabetes
    assert len(raw_diabetes) == DIABETES_ROWS
    # kept rows, recomputed: no '?' outside the ids, the label and the mostly-missing columns
    skip = {"encounter_id", "patient_nbr", "number_emergency", *DROPPED_COLUMNS}
    kept = np.array([i for i, r in enumerate(raw_diabetes)
                     if not any(v == "?" for k, v in r.items() if k not in skip)])
    test_rec = p.public_extra["test_record"]
    held = np.concatenate([*p.parts, test_rec])
    assert len(np.unique(held)) == len(held), "a record is in two shards or in a shard and test"
    assert np.isin(held, kept).all()
    dropped = np.setdiff1d(kept, held)
    assert 0 <= len(dropped) < len(p.agents)  # only the remainder of the equal split
    assert len(held) + len(dropped) == len(kept) > 90_000
    # shards equal, global test set 25% of kept rows (+- 1 row)
    sizes = {x.shape[0] for x, _ in p.agents}
    assert len(p.agents) == 64 and len(sizes) == 1
    assert abs(p.test_global[0].shape[0] - 0.25 * len(kept)) <= 1
    assert p.test_global[0].shape[0] == len(test_rec)
    X = np.vstack([x for x, _ in p.agents] + [p.test_global[0]])
    assert X.shape[1] == len(p.feature_names) and np.isfinite(X).all()
    assert row_norms(X).max() <= 1 + 1e-12
    assert np.abs(X).max(axis=0).max() <= 1 + 1e-12
    # feature names: label, ids and mostly-missing columns gone; readmitted kept; encoded names
    names = p.feature_names
    for gone in ("number_emergency", "encounter_id", "patient_nbr", *DROPPED_COLUMNS):
        assert not any(n == gone or n.startswith((f"{gone}=", f"{gone}:")) for n in names), gone
    assert "race=Caucasian" in names and "diag_1:freq" in names and "readmitted=NO" in names
    assert "max_glu_serum=None" in names and "A1Cresult=None" in names  # a level, not missing
    assert "admission_type_id=1" in names and "time_in_hospital" in names


def test_diabetes_labels_match_number_emergency(diabetes, raw_diabetes):
    p = diabetes
    emerg = np.array([int(r["number_emergency"]) for r in raw_diabetes])
    race = np.array([r["race"] for r in raw_diabetes])
    j = p.feature_names.index("race=Caucasian")
    for (x, y), idx in zip(p.agents, p.parts, strict=True):
        np.testing.assert_array_equal(y, np.where(emerg[idx] > 0, 1.0, -1.0))
        np.testing.assert_array_equal(x[:, j] > 0, race[idx] == "Caucasian")
    test_rec = p.public_extra["test_record"]
    np.testing.assert_array_equal(p.test_global[1], np.where(emerg[test_rec] > 0, 1.0, -1.0))
    # positive fraction over the kept rows (shards + test + the dropped remainder)
    skip = {"encounter_id", "patient_nbr", "number_emergency", *DROPPED_COLUMNS}
    kept = [i for i, r in enumerate(raw_diabetes) if "?" not in [v for k, v in r.items()
                                                               if k not in skip]]
    y = np.concatenate([y for _, y in p.agents] + [p.test_global[1]])
    assert set(np.unique(y)) == {-1.0, 1.0}
    held = np.concatenate([*p.parts, test_rec])
    rest = np.setdiff1d(kept, held)
    pos = int(np.sum(y > 0)) + int(np.sum(emerg[rest] > 0))
    assert pos / len(kept) == pytest.approx(np.mean(emerg[kept] > 0), abs=0)
    assert f"({pos / len(kept):.4f})" in " ".join(p.notes)


def test_diabetes_split_is_seeded():
    a_test, a_parts, a_drop = recipes._iid_test_split(1000, 0.25, 8, 1)
    b_test, b_parts, _ = recipes._iid_test_split(1000, 0.25, 8, 1)
    c_test, _, _ = recipes._iid_test_split(1000, 0.25, 8, 2)
    np.testing.assert_array_equal(a_test, b_test)
    assert all(np.array_equal(u, v) for u, v in zip(a_parts, b_parts, strict=True))
    assert not np.array_equal(a_test, c_test)
    assert len(a_test) == 250 and {len(q) for q in a_parts} == {93} and a_drop == 750 - 8 * 93


def test_diabetes_hdf5_roundtrip(diabetes, tmp_path):
    p = diabetes
    out = write_prepared(p, tmp_path / "diab.h5", recipe="diabetes",
                         options=recipes.options(recipes.get("diabetes"), {}), source=str(SHARED))
    with ShardFile(out) as f:
        assert f.n_agents == 64 and f.task == "binary" and not f.is_sparse
        assert f.n_features == len(p.feature_names) and f.feature_names == p.feature_names
        for i in (0, 63):
            X, y = f.read_agent(i)
            np.testing.assert_array_equal(X, p.agents[i][0])
            np.testing.assert_array_equal(y, p.agents[i][1])
            np.testing.assert_array_equal(f.read_agent_extra(i, "record"), p.parts[i])
        Xt, yt = f.read_test()
        np.testing.assert_array_equal(Xt, p.test_global[0])
        np.testing.assert_array_equal(yt, p.test_global[1])
        assert row_norms(Xt).max() <= 1 + 1e-12
    d = describe(out)
    assert d["recipe"] == "diabetes" and d["options"]["test_frac"] == 0.25
    steps = [s["step"] for s in d["preprocessing"]]
    assert steps.index("max_normalise") < steps.index("row_normalise") < steps.index("shuffle_split")
    assert sorted(next(s for s in d["preprocessing"] if s["step"] == "drop_columns"
                       and "max_missing_frac" in s["why"])["columns"]) == sorted(DROPPED_COLUMNS)


def test_mnist_parity_labels_norms_shards():
    p = build("mnist_parity")
    digits = readers.read_idx(SHARED / "mnist" / "train-labels-idx1-ubyte.gz")
    digits_test = readers.read_idx(SHARED / "mnist" / "t10k-labels-idx1-ubyte.gz")
    assert p.task == "binary" and len(p.agents) == 64
    assert {x.shape for x, _ in p.agents} == {(60_000 // 64, 784)}
    allidx = np.concatenate(p.parts)
    assert len(np.unique(allidx)) == len(allidx) == 64 * (60_000 // 64)
    for (x, y), idx in zip(p.agents, p.parts, strict=True):
        np.testing.assert_array_equal(y, np.where(digits[idx] % 2 == 0, 1.0, -1.0))
        assert row_norms(x).max() <= 1 + 1e-12 and x.min() >= 0
    Xt, yt = p.test_global
    assert Xt.shape == (10_000, 784)
    np.testing.assert_array_equal(yt, np.where(digits_test % 2 == 0, 1.0, -1.0))
    assert row_norms(Xt).max() <= 1 + 1e-12
    # i.i.d., not contiguous: agent 0 holds records from all over the training file
    assert p.parts[0].max() - p.parts[0].min() > 50_000
