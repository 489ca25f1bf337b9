"""Named data recipes: each paper's data setting, from the original files to a shard file.

`mpi-dp data prepare NAME [--source DIR]` runs one. Every recipe documents where it departs from
the paper (our copies are partial or substitutes: see ../shared/data/SOURCES.md), and stores its
options, steps and notes in the shard file's attributes.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import scipy.sparse as sp

from mpi_dp.data import partition as part
from mpi_dp.data import preprocess as pre
from mpi_dp.data import readers, shard_graph
from mpi_dp.data.prepare import Prepared, as_pairs, reader_decisions
from mpi_dp.errors import DataError
from mpi_dp.rng import stream


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A named preset: which files, which options (overridable), and how to build the shards."""

    name: str
    dataset: str
    summary: str
    files: tuple[tuple[str, ...], ...]  # per needed file: candidate paths relative to a source dir
    defaults: Mapping[str, Any]
    build: Callable[[list[Path], dict[str, Any]], Prepared]
    notes: tuple[str, ...] = ()


def locate(sources: Sequence[Path], candidates: Sequence[str], dataset: str) -> Path:
    """The first existing candidate under any source dir (also SOURCE/DATASET/basename)."""
    tried = []
    for src in sources:
        for c in candidates:
            for p in (src / c, src / dataset / Path(c).name, src / Path(c).name):
                tried.append(p)
                if p.exists():
                    return p
    shown = "\n  ".join(dict.fromkeys(str(t) for t in tried[:8]))
    raise DataError(f"data for recipe '{dataset}' not found; looked for:\n  {shown}\n"
                    f"get it with `mpi-dp data fetch {dataset}` or point --source at a folder "
                    "holding it (e.g. --source ../shared/data)")


def _files(table_info: Mapping[str, Any]) -> list[dict[str, Any]]:
    files = table_info.get("files", [])
    return list(files) if isinstance(files, list) else [files]


# -- lending (seeds 000/001) ----------------------------------------------------------------
_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
_EPOCH = _dt.date(1970, 1, 1)


def _date_days(s: str) -> float:
    """'Dec-2018' -> days since 1970-01-01 (first of the month); nan when not a date."""
    m = re.fullmatch(r"\s*([A-Za-z]{3})-(\d{4})\s*", s)
    if not m or m.group(1).lower() not in _MONTHS:
        return math.nan
    return float((_dt.date(int(m.group(2)), _MONTHS[m.group(1).lower()], 1) - _EPOCH).days)


def _term(s: str) -> float:
    m = re.search(r"(\d+)", s)
    return float(m.group(1)) if m else math.nan


def _emp_length(s: str) -> float:
    s = s.strip().lower()
    if s in ("n/a", ""):
        return -1.0
    if s.startswith("<"):
        return 0.0
    m = re.search(r"(\d+)", s)
    return float(m.group(1)) if m else -1.0


def _grade(s: str) -> float:
    s = s.strip().upper()
    return float(ord(s[0]) - ord("A")) if s and "A" <= s[0] <= "G" else math.nan


def _sub_grade(s: str) -> float:
    s = s.strip().upper()
    if len(s) == 2 and "A" <= s[0] <= "G" and s[1].isdigit():
        return float(5 * (ord(s[0]) - ord("A")) + int(s[1]) - 1)
    return math.nan


def _home(s: str) -> float:
    return {"RENT": 1.0, "OWN": 2.0, "MORTGAGE": 3.0}.get(s.strip().upper(), 4.0)


LENDING_DATES = ("issue_d", "earliest_cr_line", "last_pymnt_d", "next_pymnt_d",
                 "last_credit_pull_d", "sec_app_earliest_cr_line", "hardship_start_date",
                 "hardship_end_date", "payment_plan_start_date", "debt_settlement_flag_date",
                 "settlement_date")
LENDING_DROP = ("id", "member_id", "url", "desc", "emp_title", "title")


def _pca_public(X: np.ndarray, pub: np.ndarray, k: int | None, steps: list, what: str):
    params = pre.fit_pca(X[pub], k, centred=False)
    steps.append({"step": "pca", "fitted_on": what, "k": int(params["V"].shape[1]),
                  "centred": False, "whiten": True, "eigenvalues": params["D"]})
    return pre.apply_pca(X, params, whiten=True), params


def _owner_blocks(n: int, rest: np.ndarray, pub: np.ndarray, o: Mapping[str, Any]):
    """Owner sizes (option `sizes`, else `agents` equal shares of the non-public records) and
    the contiguous blocks they get, skipping the hold-out (seed 001's owners 1..N)."""
    sizes = o["sizes"] or [len(rest) // int(o["agents"])] * int(o["agents"])
    return sizes, part.blocks(n, sizes, exclude=pub)


def _decisions(info: Mapping[str, Any], n: int, parts: Sequence[np.ndarray], pub: np.ndarray,
               why: str) -> dict[str, Any]:
    """The reader's decisions plus the records the partition gives no owner (`why`), so that
    rows read = records in the shard file (owners + hold-out) + rows dropped."""
    d = reader_decisions(info)
    left = n - len(pub) - sum(len(p) for p in parts)
    if left:
        d["rows_dropped"][why] = int(left)
    return d


def build_lending(paths: list[Path], o: dict[str, Any]) -> Prepared:
    conv: dict[str, Callable[[str], float]] = {c: _date_days for c in LENDING_DATES}
    conv.update(term=_term, emp_length=_emp_length, grade=_grade, sub_grade=_sub_grade,
                home_ownership=_home)
    t = readers.read_csv(paths[0], "int_rate", drop=LENDING_DROP, categorical="auto",
                         encoding="codes", missing="zero", converters=conv)
    n = t.X.shape[0]
    rest, pub = part.holdout_last(n, int(o["public"]))
    steps: list[dict[str, Any]] = [{"step": "read_csv", "target": "int_rate", "drop": LENDING_DROP,
                                    "encoding": "codes", "missing": "zero",
                                    "converters": sorted(conv)}]
    Z, params = _pca_public(np.asarray(t.X), pub, int(o["pca"]), steps, f"last {len(pub)} rows")
    sizes, parts = _owner_blocks(n, rest, pub, o)
    return Prepared(
        agents=as_pairs(Z, t.y, parts), task="regression",
        feature_names=[f"pc{j + 1}" for j in range(Z.shape[1])], public=(Z[pub], t.y[pub]),
        public_extra={"pca_V": params["V"], "pca_D": params["D"]}, steps=steps,
        source_files=_files(t.info), partition={"kind": "blocks", "holdout": "last",
                                                "public": len(pub)},
        parts=parts, public_index=pub,
        decisions=_decisions(t.info, n, parts, pub, "beyond the owners' blocks (sizes)"),
        notes=[f"Kaggle-2018 sample: {n:,} rows (the paper used ~887k); public PCA hold-out = last "
               f"{len(pub):,} rows (paper: 10,000); owners get contiguous blocks of {sizes}: "
               "psi/eps/n figures at the paper's n_i = 1e3..1e5 are not reachable with this file"])


# -- credit card fraud (seed 001 L-SVM) -----------------------------------------------------
def build_creditcard(paths: list[Path], o: dict[str, Any]) -> Prepared:
    t = readers.read_csv(paths[0], "Class", drop=("Time",), categorical=None, missing="error")
    X = np.asarray(t.X, dtype=np.float64).copy()
    n = X.shape[0]
    rest, pub = part.holdout_last(n, int(o["public"]))
    j = t.feature_names.index("Amount")
    X[:, j] = np.log1p(X[:, j])
    mu, sd = float(X[pub, j].mean()), float(X[pub, j].std()) or 1.0
    X[:, j] = (X[:, j] - mu) / sd
    X = pre.add_bias(X)
    y = np.where(t.y > 0.5, 1.0, -1.0)
    sizes, parts = _owner_blocks(n, rest, pub, o)
    frauds = [int(np.sum(y[idx] > 0)) for idx in parts]
    return Prepared(
        agents=as_pairs(X, y, parts), task="binary", feature_names=[*t.feature_names, "bias"],
        public=(X[pub], y[pub]), steps=[
            {"step": "read_csv", "target": "Class", "drop": ["Time"]},
            {"step": "log1p_zscore", "column": "Amount", "fitted_on": f"last {len(pub)} rows",
             "mean": mu, "std": sd},
            {"step": "add_bias"}, {"step": "labels", "map": {"0": -1, "1": 1}}],
        source_files=_files(t.info), partition={"kind": "blocks", "public": len(pub)},
        parts=parts, public_index=pub,
        decisions=_decisions(t.info, n, parts, pub, "beyond the owners' blocks (sizes)"),
        notes=[f"prefix of creditcard.csv: {n:,} rows with {int(np.sum(y > 0))} frauds in all "
               f"(owners hold {frauds}); a pipeline smoke test for the hinge loss, not a fraud "
               "study (the full file has 284,807 rows, 492 frauds)"])


# -- SPARCS length of stay (seed 000 hospital) ----------------------------------------------
SPARCS_FEATURES = ("age", "Gender", "Race", "Ethnicity", "CCSR.Diagnosis.Code",
                   "CCSR.Procedure.Code", "APR.DRG.Code", "APR.Medical.Surgical.Description")
SPARCS_KEY = "Permanent.Facility.Id"


def build_sparcs(paths: list[Path], o: dict[str, Any]) -> Prepared:
    t = readers.read_csv(paths[0], "los", columns=SPARCS_FEATURES, keys=(SPARCS_KEY,),
                         categorical=SPARCS_FEATURES, encoding="codes", missing="zero")
    n = t.X.shape[0]
    rest, pub = part.holdout_last(n, int(o["public"]))
    steps: list[dict[str, Any]] = [{"step": "read_csv", "target": "los", "features": SPARCS_FEATURES,
                                    "encoding": "codes", "missing": "zero"}]
    Z, params = _pca_public(np.asarray(t.X), pub, None, steps, f"last {len(pub)} rows")
    try:
        parts, kept = part.by_key(t.keys[SPARCS_KEY], min_records=int(o["min_records"]),
                                  exclude=pub)
    except DataError as e:
        raise DataError(f"{paths[0]}: facilities ({SPARCS_KEY}) as owners: {e}") from None
    return Prepared(
        agents=as_pairs(Z, t.y, parts), task="regression",
        feature_names=[f"pc{j + 1}" for j in range(Z.shape[1])], public=(Z[pub], t.y[pub]),
        public_extra={"pca_V": params["V"], "pca_D": params["D"],
                      "facility_id": np.asarray(kept, dtype=np.float64)},
        steps=steps, source_files=_files(t.info),
        partition={"kind": "by_key", "key": SPARCS_KEY, "min_records": int(o["min_records"]),
                   "public": len(pub)},
        parts=parts, public_index=pub,
        decisions=_decisions(t.info, n, parts, pub,
                             f"facility under min_records {int(o['min_records'])}"),
        notes=["SPARCS 2020 musculoskeletal course subset (36,631 rows), not the 2015 file (2.35M "
               "rows): Type of Admission and the APR MDC code are absent (APR medical/surgical "
               f"type stands in), age is the course's recoded group; owners = {len(parts)} "
               f"facilities with >= {int(o['min_records'])} records (paper: 86 facilities with "
               ">= 10,000)"])


# -- MNIST (seed 002) ------------------------------------------------------------------------
def build_mnist(paths: list[Path], o: dict[str, Any]) -> Prepared:
    train, test = readers.read_mnist(paths[0].parent)
    X = np.asarray(train.X) / 255.0
    parts = part.equal_blocks(X.shape[0], int(o["agents"]))
    return Prepared(
        agents=as_pairs(X, train.y, parts), task="multiclass", feature_names=train.feature_names,
        test_global=(np.asarray(test.X) / 255.0, test.y),
        steps=[{"step": "scale", "factor": 1 / 255}], source_files=_files(train.info),
        partition={"kind": "equal_blocks", "contiguous": True}, parts=parts)


# -- FEMNIST (seed 002) ----------------------------------------------------------------------
def build_femnist(paths: list[Path], o: dict[str, Any]) -> Prepared:
    train, test = readers.read_leaf(paths[0], require_both=True)
    users = train.info["users"]
    tr, _ = part.natural(train.keys["user"])
    te, kept = part.natural(test.keys["user"])
    if len(tr) != len(te):
        raise DataError(f"{paths[0]}: {len(tr)} users with training records but {len(te)} with "
                        "test records (require_both)")
    Xtr, Xte = 1.0 - np.asarray(train.X), 1.0 - np.asarray(test.X)
    return Prepared(
        agents=as_pairs(Xtr, train.y, tr), task="multiclass", feature_names=train.feature_names,
        tests=list(as_pairs(Xte, test.y, te)), steps=[{"step": "invert", "x": "1 - x"}],
        source_files=_files(train.info),
        partition={"kind": "natural", "key": "LEAF user", "users": [users[int(k)] for k in kept]},
        notes=[f"5% LEAF sample, partial (20 of 35 train shards): {len(tr)} writers with both "
               "train and test records (the paper: 195 writers)"])


# -- Reuters (seed 003, sparse) --------------------------------------------------------------
def build_reuters(paths: list[Path], o: dict[str, Any]) -> Prepared:
    train = readers.read_libsvm(paths[0])
    test = readers.read_libsvm(paths[1], n_features=train.X.shape[1])
    steps: list[dict[str, Any]] = [{"step": "read_libsvm", "sparse": True}]
    X, Xt = train.X, test.X
    norms = np.sqrt(np.asarray(cast(sp.csr_matrix, X).multiply(X).sum(axis=1)).ravel())  # libsvm: CSR
    if norms.max() > 1 + 1e-9:
        X, Xt = pre.row_normalise(X, "l2"), pre.row_normalise(Xt, "l2")
        steps.append({"step": "row_normalise", "norm": "l2"})
    else:
        steps.append({"step": "check_row_norms", "max_l2": float(norms.max())})
    parts = part.iid(X.shape[0], int(o["agents"]), int(o["seed"]))
    return Prepared(
        agents=as_pairs(X, train.y, parts), task="binary", feature_names=train.feature_names,
        test_global=(Xt, test.y), steps=steps, source_files=_files(train.info) + _files(test.info),
        partition={"kind": "iid", "seed": int(o["seed"])}, parts=parts,
        notes=["Reuters-21578 (LaSVM split) stands in for RCV1/Real-sim, which are not available"])


# -- Diabetes 130-US hospitals and MNIST parity (seed 003, DOLA) ----------------------------
DIABETES_MEMBER = "diabetic_data.csv"
DIABETES_IDS = ("encounter_id", "patient_nbr")
DIABETES_LABEL = "number_emergency"
DIABETES_CODES = ("admission_type_id", "discharge_disposition_id", "admission_source_id")
UCI_MISSING = "?"  # the only missing token: 'None' in max_glu_serum/A1Cresult is a real level


def _as_float(v: np.ndarray) -> np.ndarray | None:
    try:
        return v.astype(np.float64)
    except ValueError:
        return None


def _encode_categorical(v: np.ndarray, name: str, max_levels: int
                        ) -> tuple[np.ndarray, list[str], str, int]:
    """One-hot (levels <= max_levels, one column per level in sorted order) or frequency encoding
    (value -> its relative frequency among the rows given): (columns (n, k), names, kind, levels)."""
    levels, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    if len(levels) <= max_levels:
        return (np.eye(len(levels))[inverse], [f"{name}={lv}" for lv in levels.tolist()], "onehot",
                len(levels))
    return (counts[inverse, None] / v.size, [f"{name}:freq"], "frequency", len(levels))


def _iid_test_split(n: int, test_frac: float, agents: int, seed: int
                    ) -> tuple[np.ndarray, list[np.ndarray], int]:
    """One shuffle from stream(seed, "partition"): the first round(test_frac n) records are the
    global test set, the rest go to `agents` equal shards (sorted); returns (test, parts, dropped)."""
    if not 0 < test_frac < 1:
        raise DataError(f"test_frac must lie in (0, 1), got {test_frac}")
    if int(agents) != agents or agents < 1:
        raise DataError(f"agents must be a positive integer, got {agents}")
    n_test = int(np.floor(test_frac * n + 0.5))
    perm = stream(seed, "partition").permutation(n)
    rest = perm[n_test:]
    size = rest.size // agents
    if size == 0:
        raise DataError(f"{agents:,} agents need at least one record each but only {rest.size:,} "
                        "records are left after the test split")
    parts = [np.sort(rest[i * size:(i + 1) * size]).astype(np.int64) for i in range(agents)]
    return np.sort(perm[:n_test]).astype(np.int64), parts, int(rest.size - agents * size)


def build_diabetes(paths: list[Path], o: dict[str, Any]) -> Prepared:
    names, table, info = readers.read_csv_strings(paths[0], member=DIABETES_MEMBER)
    absent = [c for c in (*DIABETES_IDS, DIABETES_LABEL) if c not in table]
    if absent:
        raise DataError(f"{info['member']}: no column(s) {absent} (not the UCI diabetic_data.csv)")
    n_raw = int(info["n_rows"])
    emerg = _as_float(table[DIABETES_LABEL])
    if emerg is None:
        raise DataError(f"{info['member']}: column {DIABETES_LABEL!r} is not numeric throughout")
    max_frac, max_levels = float(o["max_missing_frac"]), int(o["onehot_max_levels"])
    steps: list[dict[str, Any]] = [
        {"step": "read_csv", "member": info["member"], "missing_token": UCI_MISSING},
        {"step": "label", "y": f"+1 iff {DIABETES_LABEL} > 0 else -1", "drop": DIABETES_LABEL},
        {"step": "drop_columns", "columns": list(DIABETES_IDS), "why": "identifiers"}]
    feats = [c for c in names if c not in (*DIABETES_IDS, DIABETES_LABEL)]
    miss = {c: table[c] == UCI_MISSING for c in feats}
    frac = {c: float(miss[c].mean()) for c in feats}
    sparse_cols = {c: round(f, 4) for c, f in frac.items() if f > max_frac}
    feats = [c for c in feats if c not in sparse_cols]
    steps.append({"step": "drop_columns", "columns": sparse_cols,
                  "why": f"missing fraction > max_missing_frac = {max_frac}"})
    bad = np.zeros(n_raw, dtype=bool)
    for c in feats:
        bad |= miss[c]
    keep = np.flatnonzero(~bad)
    steps.append({"step": "drop_rows", "why": "any missing value", "dropped": int(bad.sum()),
                  "kept": int(keep.size)})
    blocks: list[np.ndarray] = []
    feature_names: list[str] = []
    enc: dict[str, dict[str, int]] = {"numeric": {}, "onehot": {}, "frequency": {}}
    for c in feats:
        v = table[c][keep]
        num = None if c in DIABETES_CODES else _as_float(v)
        if num is not None:
            blocks.append(num[:, None])
            feature_names.append(c)
            enc["numeric"][c] = 1
            continue
        if c in DIABETES_CODES:
            v = v.astype(np.int64)  # codes: levels in numeric order
        cols, cnames, kind, n_levels = _encode_categorical(v, c, max_levels)
        blocks.append(cols)
        feature_names += cnames
        enc[kind][c] = n_levels
    steps.append({"step": "encode", "onehot_max_levels": max_levels, "codes_as_categorical":
                  list(DIABETES_CODES), "numeric": sorted(enc["numeric"]),
                  "onehot_levels": enc["onehot"], "frequency_levels": enc["frequency"],
                  "frequency_of": "all kept rows"})
    X, divisors = pre.max_normalise(np.hstack(blocks))
    steps.append({"step": "max_normalise", "fitted_on": "all kept rows", "divisors": divisors})
    X = pre.row_normalise(X, "l2")
    steps.append({"step": "row_normalise", "norm": "l2", "rule": "x / max(1, ||x||)"})
    y = np.where(emerg[keep] > 0, 1.0, -1.0)
    agents, seed, test_frac = int(o["agents"]), int(o["seed"]), float(o["test_frac"])
    test, parts, dropped = _iid_test_split(keep.size, test_frac, agents, seed)
    steps.append({"step": "shuffle_split", "stream": "partition", "seed": seed,
                  "test_frac": test_frac, "test": int(test.size), "agents": agents,
                  "dropped_remainder": dropped})
    n, p, pos = int(keep.size), X.shape[1], int(np.sum(y > 0))
    return Prepared(
        agents=as_pairs(X, y, parts), task="binary", feature_names=feature_names,
        test_global=(X[test], y[test]), public_extra={"test_record": keep[test]}, steps=steps,
        source_files=_files(info),
        partition={"kind": "iid", "seed": seed, "test_frac": test_frac, "test": int(test.size),
                   "dropped_remainder": dropped,
                   "record": f"0-based data row of {DIABETES_MEMBER} (test rows: public "
                             "extra test_record)"},
        parts=[keep[idx] for idx in parts],
        notes=[f"UCI diabetic_data.csv: {n_raw:,} rows; columns missing ('?') in more than "
               f"{max_frac} of rows dropped: {sparse_cols}; then {n_raw - n:,} rows with a missing "
               f"value dropped: {n:,} rows kept, dim {p} after encoding (paper: 100,000 x 55; "
               "our dim is what this encoding gives)",
               f"y = +1 iff {DIABETES_LABEL} > 0: {pos:,} of {n:,} kept rows positive "
               f"({pos / n:.4f})",
               f"global test set {test.size:,} rows ({test_frac:g}); {agents} agents x "
               f"{parts[0].size:,} rows; {dropped} remainder row(s) dropped",
               "column maxima (max-abs scaling) and frequency-encoding tables are computed on all "
               "kept rows, test set included, and are not privatised (spec §4 (d))",
               f"the spec's default max_missing_frac is 0.4, but payer_code is missing in "
               f"{frac.get('payer_code', math.nan):.2%} of rows: at 0.4 it stays and row dropping "
               "loses ~40% of the rows, so this recipe's default is 0.3, which drops weight, "
               "payer_code and medical_specialty (the columns the spec names)"])


def build_mnist_parity(paths: list[Path], o: dict[str, Any]) -> Prepared:
    train, test = readers.read_mnist(paths[0].parent)
    X = pre.row_normalise(np.asarray(train.X) / 255.0, "l2")
    Xt = pre.row_normalise(np.asarray(test.X) / 255.0, "l2")
    y = np.where(train.y % 2 == 0, 1.0, -1.0)
    yt = np.where(test.y % 2 == 0, 1.0, -1.0)
    agents, seed = int(o["agents"]), int(o["seed"])
    parts = part.iid(X.shape[0], agents, seed)
    dropped = X.shape[0] - sum(idx.size for idx in parts)
    return Prepared(
        agents=as_pairs(X, y, parts), task="binary", feature_names=train.feature_names,
        test_global=(Xt, yt),
        steps=[{"step": "labels", "y": "+1 for even digits, -1 for odd"},
               {"step": "scale", "factor": 1 / 255},
               {"step": "row_normalise", "norm": "l2", "rule": "x / max(1, ||x||)"}],
        source_files=_files(train.info) + _files(test.info),
        partition={"kind": "iid", "seed": seed, "dropped_remainder": dropped}, parts=parts,
        notes=[f"MNIST as even (+1) vs odd (-1): {int(np.sum(y > 0)):,} of {y.size:,} training "
               f"images even; {agents} agents x {parts[0].size:,} images, {dropped} dropped; the "
               f"10,000-image test set ({int(np.sum(yt > 0)):,} even) is the global test set"])


# -- MovieLens-100K (seed 004) ---------------------------------------------------------------
def _als_half(F: np.ndarray, groups: list[np.ndarray], other: np.ndarray, r: np.ndarray,
              reg: float) -> np.ndarray:
    """One ALS-WR half-sweep: row g solves (sum_k f_k f_k^T + reg n_g I) x = sum_k r_k f_k over
    the ratings k in groups[g] (n_g of them), f_k = F[other[k]]; empty groups get 0. The Gram
    matrices are built per group (BLAS), the systems solved in one batched call."""
    n, rank = len(groups), F.shape[1]
    M = np.zeros((n, rank, rank))
    b = np.zeros((n, rank))
    for g, idx in enumerate(groups):
        A = F[other[idx]]
        M[g] = A.T @ A
        b[g] = r[idx] @ A
    sizes = np.array([len(idx) for idx in groups], dtype=np.float64)
    M += (reg * np.maximum(sizes, 1.0))[:, None, None] * np.eye(rank)
    return np.linalg.solve(M, b[:, :, None])[:, :, 0]


def _groups(key: np.ndarray, n: int) -> list[np.ndarray]:
    """Indices of the entries with key 0, 1, ..., n - 1 (each ascending)."""
    order = np.argsort(key, kind="stable")
    return np.split(order, np.searchsorted(key[order], np.arange(1, n)))


def als_item_features(user: np.ndarray, item: np.ndarray, r: np.ndarray, n_users: int,
                      n_items: int, rank: int, reg: float, sweeps: int, seed: int) -> np.ndarray:
    """ALS-WR (Zhou et al. 2008) on the given ratings; returns the item factors (n_items, rank).

    Each half-sweep solves (F^T F + reg n I) x = F^T r for every user (item), n its number of
    ratings; items without ratings get zero factors. Init: N(0, 0.01) from stream (seed, "init").
    """
    g = stream(seed, "init")
    P = 0.1 * g.standard_normal((n_users, rank))
    Q = 0.1 * g.standard_normal((n_items, rank))
    by_user, by_item = _groups(user, n_users), _groups(item, n_items)
    r = np.asarray(r, dtype=np.float64)
    for _ in range(sweeps):
        P = _als_half(Q, by_user, item, r, reg)
        Q = _als_half(P, by_item, user, r, reg)
    return Q


def knn_graph(R: np.ndarray, k: int) -> np.ndarray:
    """Edges (E, 2) int64, i < j, row-major order, of the symmetrised (OR) k-nearest-neighbour
    graph by cosine similarity of the rows of R (ties: the lower index first)."""
    if not 1 <= k < R.shape[0]:
        raise DataError(f"knn: k must lie in 1..{R.shape[0] - 1}, got {k}")
    norms = np.linalg.norm(R, axis=1)
    S = (R @ R.T) / np.maximum(np.outer(norms, norms), 1e-300)
    np.fill_diagonal(S, -np.inf)
    nn = np.argsort(-S, axis=1, kind="stable")[:, :k]
    A = np.zeros(S.shape, dtype=bool)
    A[np.repeat(np.arange(S.shape[0]), k), nn.ravel()] = True
    A |= A.T
    i, j = np.nonzero(np.triu(A, 1))
    return np.stack([i, j], axis=1).astype(np.int64)


def build_movielens(paths: list[Path], o: dict[str, Any]) -> Prepared:
    ml = readers.read_movielens(paths[0])
    n_users, n_items = int(ml.user.max()) + 1, ml.item_genres.shape[0]
    users, _ = part.natural(ml.user)
    tr, te = part.train_test_split(users, float(o["test_frac"]), int(o["seed"]))
    tr_idx = np.concatenate(tr)
    rank, k = int(o["rank"]), int(o["knn"])
    Q = als_item_features(ml.user[tr_idx], ml.item[tr_idx], ml.rating[tr_idx], n_users, n_items,
                          rank, float(o["reg"]), int(o["sweeps"]), int(o["seed"]))
    unrated = int(n_items - np.unique(ml.item[tr_idx]).size)
    means = np.array([ml.rating[idx].mean() for idx in tr])
    R = np.zeros((n_users, n_items))
    for u, idx in enumerate(tr):
        R[u, ml.item[idx]] = ml.rating[idx] - means[u]
    edges = knn_graph(R, k)
    graph = shard_graph.graph_arrays(shard_graph.graph_matrix(  # DataError if disconnected
        edges, np.ones(len(edges)), n_users, where="movielens kNN graph"))
    deg = np.bincount(edges.ravel(), minlength=n_users)
    item_norm_max = float(np.linalg.norm(Q, axis=1).max())
    agents = [(Q[ml.item[idx]], ml.rating[idx] - means[u]) for u, idx in enumerate(tr)]
    tests = [(Q[ml.item[idx]], ml.rating[idx] - means[u]) for u, idx in enumerate(te)]
    extra = [{"item": ml.item[a].astype(np.int64), "item_test_meta": ml.item[b].astype(np.int64),
              "mean_meta": np.array([means[u]])} for u, (a, b) in enumerate(zip(tr, te, strict=True))]
    return Prepared(
        agents=agents, task="regression", feature_names=[f"als{j + 1}" for j in range(rank)],
        tests=tests, agent_extra=extra,
        public_extra={"item_features": Q, "item_norm_max": np.float64(item_norm_max), **graph,
                      "user_mean": means},
        steps=[{"step": "split", "test_frac": float(o["test_frac"]), "per": "user",
                "test": "floor(test_frac n_u + 0.5) ratings per user", "seed": int(o["seed"])},
               {"step": "centre", "by": "user train mean"},
               {"step": "als_wr", "rank": rank, "reg": float(o["reg"]), "sweeps": int(o["sweeps"]),
                "on": "raw train ratings", "items_without_train_ratings": unrated,
                "item_norm_max": item_norm_max},
               {"step": "knn_graph", "k": k, "similarity": "cosine of centred train "
                "rating vectors", "symmetrised": "or", "weights": 1.0, "edges": int(len(edges)),
                "degree_min": int(deg.min()), "degree_mean": float(deg.mean()),
                "degree_max": int(deg.max()), "connected": True}],
        source_files=_files(ml.info),
        partition={"kind": "natural", "key": "user", "train_test": "per user"}, parts=tr,
        notes=["item features (ALS on all users' train ratings) and the kNN graph are treated as "
               "public, as the paper does, although they leak train data; MovieLens may not be "
               "redistributed: keep this shard file private",
               f"graph: {len(edges):,} edges (/public/graph_edges, weights 1), degree "
               f"{deg.min()}..{deg.max()} (mean {deg.mean():.1f}), connected; "
               f"/public/item_norm_max = {item_norm_max:.4g} bounds every feature row's L2 norm; "
               f"{unrated} items without train ratings have zero features"])


RECIPES: dict[str, Recipe] = {
    r.name: r for r in (
        Recipe("lending", "lending", "Lending Club interest-rate regression (seeds 000/001): "
               "integer-coded columns, PCA (uncentred, whitened, k=10) on a public hold-out, "
               "3 owners in contiguous blocks",
               (("lending_club/loan_kaggle2018_first2433rows.csv", "lending/loan.csv"),),
               {"public": 433, "pca": 10, "agents": 3, "sizes": None}, build_lending),
        Recipe("creditcard", "creditcard", "credit-card fraud L-SVM smoke test (seed 001): V1-V28, "
               "log1p+z-scored Amount, bias (p=30), labels -1/+1, 3 owners in blocks",
               (("creditcard_fraud/creditcard_first3065rows.csv", "creditcard/creditcard.csv"),),
               {"public": 565, "agents": 3, "sizes": None}, build_creditcard),
        Recipe("sparcs", "sparcs", "NY SPARCS length of stay by facility (seed 000 hospital): "
               "integer-coded patient features, PCA (all, whitened) on a public hold-out, "
               "facilities with >= min_records as owners",
               (("sparcs2020_musculoskeletal/week10_df_musc_skel.csv.gz",),),
               {"public": 5000, "min_records": 500}, build_sparcs),
        Recipe("mnist", "mnist", "MNIST (seed 002): x/255, 10 owners of 6,000 contiguous records, "
               "the 10,000-image test set as a global test set",
               (("mnist/train-images-idx3-ubyte.gz", "mnist/train-images-idx3-ubyte"),),
               {"agents": 10}, build_mnist),
        Recipe("femnist", "femnist", "FEMNIST (seed 002): LEAF writers as owners, x' = 1 - x, each "
               "writer's LEAF test split as its test set",
               (("femnist_leaf_sf0.05_partial.tar.xz", "femnist"),), {}, build_femnist),
        Recipe("reuters", "reuters", "Reuters-21578 LIBSVM (seed 003, sparse): CSR kept, rows of "
               "L2 norm <= 1 checked, i.i.d. equal split, test file as global test set",
               (("reuters21578_lasvm_tick/reuters.trn.bz2",),
                ("reuters21578_lasvm_tick/reuters.tst.bz2",)),
               {"agents": 64, "seed": 1}, build_reuters),
        Recipe("diabetes", "diabetes", "Diabetes 130-US hospitals (seed 003 DOLA): y = +1 iff "
               "number_emergency > 0, mostly-missing columns then rows with '?' dropped, one-hot "
               "(<= 16 levels) or frequency encoding, max-abs columns, rows L2 <= 1, 25% global "
               "test set, i.i.d. equal shards",
               (("diabetes130/dataset_diabetes.zip",),),
               {"agents": 64, "seed": 1, "test_frac": 0.25, "max_missing_frac": 0.3,
                "onehot_max_levels": 16}, build_diabetes),
        Recipe("mnist_parity", "mnist", "MNIST even (+1) vs odd (-1) (seed 003 DOLA): x/255, rows "
               "L2 <= 1, i.i.d. equal shards, the 10,000-image test set as a global test set",
               (("mnist/train-images-idx3-ubyte.gz", "mnist/train-images-idx3-ubyte"),),
               {"agents": 64, "seed": 1}, build_mnist_parity),
        Recipe("movielens", "movielens", "MovieLens-100K (seed 004): users as owners, 80/20 split "
               "per user, ratings centred by the user's train mean, ALS-WR item features "
               "(rank 20), cosine 10-NN user graph",
               (("ml-100k.tar.xz", "ml-100k.zip", "ml-100k"),),
               {"test_frac": 0.2, "seed": 1, "rank": 20, "reg": 0.05, "sweeps": 20, "knn": 10},
               build_movielens),
    )
}


def get(name: str) -> Recipe:
    """The recipe `name`; DataError listing the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise DataError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)} "
                        "(or 'csv' / 'libsvm' for a file of your own)") from None


def options(recipe: Recipe, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Recipe defaults updated with the user's overrides (unknown keys are an error)."""
    unknown = sorted(set(overrides) - set(recipe.defaults))
    if unknown:
        raise DataError(f"recipe {recipe.name!r} has no option(s) {unknown}; its options: "
                        f"{dict(recipe.defaults)}")
    return {**recipe.defaults, **overrides}


def resolve_files(recipe: Recipe, sources: Sequence[Path]) -> list[Path]:
    return [locate(sources, cands, recipe.dataset) for cands in recipe.files]
