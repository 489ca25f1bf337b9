"""LIBSVM / SVMlight text files into a Table with a CSR feature matrix (`read_libsvm`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse

from mpi_dp.data.readers.common import Table, _decode, _file_record, _read_bytes, _require_text_file
from mpi_dp.errors import DataError

# ----------------------------------------------------------------------------------------------
# LIBSVM / SVMlight


def _libsvm_tokens(text: str) -> tuple[list[str], list[int], list[str], list[int]]:
    """Labels, source line numbers, all idx:val tokens and the token count of each record."""
    labels: list[str] = []
    line_nos: list[int] = []
    tokens: list[str] = []
    counts: list[int] = []
    for no, line in enumerate(text.splitlines(), start=1):
        hash_at = line.find("#")
        if hash_at >= 0:
            line = line[:hash_at]
        parts = line.split()
        if not parts:
            continue
        labels.append(parts[0])  # parsed below, all at once
        line_nos.append(no)
        feats = [t for t in parts[1:] if not t.startswith("qid:")]
        tokens.extend(feats)
        counts.append(len(feats))
    return labels, line_nos, tokens, counts


def _libsvm_bad_token(path: Path, tokens: list[str], token_line: np.ndarray) -> DataError:
    """The first malformed idx:val token, as a DataError naming its line."""
    for t, no in zip(tokens, token_line, strict=True):
        idx, sep, val = t.partition(":")
        try:
            ok = sep == ":" and int(idx) >= 1 and bool(np.isfinite(float(val)))
        except ValueError:
            ok = False
        if not ok:
            return DataError(f"{path}: malformed LIBSVM line {no}: bad feature token {t!r} "
                             f"(expected index:value with a 1-based integer index)")
    return DataError(f"{path}: malformed LIBSVM data")


def read_libsvm(path: str | Path, n_features: int | None = None) -> Table:
    """Read a LIBSVM/SVMlight file into a Table with a CSR X (sorted indices, duplicates summed).

    Indices are 1-based; ``qid:`` tokens and text after ``#`` are ignored; n_features defaults to
    the largest index. Labels are kept as written (float64).
    """
    path = Path(path)
    _require_text_file(path, "LIBSVM")
    text, _ = _decode(_read_bytes(path))
    labels_s, line_nos, tokens, counts = _libsvm_tokens(text)
    if not labels_s:
        raise DataError(f"{path}: has no LIBSVM records")
    lines = np.asarray(line_nos, dtype=np.int64)
    try:
        y = np.asarray(labels_s, dtype=str).astype(np.float64)
    except ValueError:
        for s, no in zip(labels_s, line_nos, strict=True):
            try:
                float(s)
            except ValueError:
                raise DataError(f"{path}: malformed LIBSVM line {no}: label {s!r} is not a number") from None
        raise DataError(f"{path}: malformed LIBSVM labels") from None
    if not np.isfinite(y).all():
        no = int(lines[np.flatnonzero(~np.isfinite(y))[0]])
        raise DataError(f"{path}: malformed LIBSVM line {no}: the label is not finite")
    counts_a = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(len(y), dtype=np.int64), counts_a)
    if tokens:
        parts = np.char.partition(np.asarray(tokens, dtype=str), ":")
        try:
            if not np.all(parts[:, 1] == ":"):
                raise ValueError
            idx = parts[:, 0].astype(np.int64)
            val = parts[:, 2].astype(np.float64)
            if idx.min() < 1 or not np.isfinite(val).all():
                raise ValueError
        except ValueError:
            raise _libsvm_bad_token(path, tokens, lines[rows]) from None
        max_index = int(idx.max())
    else:
        idx, val, max_index = np.zeros(0, np.int64), np.zeros(0), 0
    if n_features is None:
        n_features = max_index
    elif n_features < max_index:
        raise DataError(f"{path}: has feature index {max_index} but n_features = {n_features} was given")
    X = scipy.sparse.coo_matrix((val, (rows, idx - 1)), shape=(len(y), n_features)).tocsr()
    X.sum_duplicates()
    X.sort_indices()
    levels, lcounts = np.unique(y, return_counts=True)
    info = {"reader": "libsvm", "files": [_file_record(path)], "n_rows": len(y),
            "n_features": int(n_features), "max_index": max_index, "nnz": int(X.nnz),
            "label_counts": {repr(float(v)): int(c) for v, c in zip(levels, lcounts, strict=True)}}
    return Table(X=X, y=y, feature_names=[f"f{j}" for j in range(1, n_features + 1)], target="label",
                 keys={}, info=info)
