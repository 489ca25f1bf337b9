"""IDX arrays (`read_idx`) and the MNIST train and test sets built from them (`read_mnist`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mpi_dp.data.readers.common import Table, _file_record, _read_bytes
from mpi_dp.errors import DataError

# ----------------------------------------------------------------------------------------------
# IDX / MNIST

_IDX_SHAPES = {2049: 1, 2051: 3}


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX array (MNIST): magic 2049 -> uint8 labels (n,), 2051 -> uint8 images (n, rows, cols)."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise DataError(f"{path}: too short for an IDX file ({len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    if magic not in _IDX_SHAPES:
        raise DataError(f"{path}: bad IDX magic number {magic} (expected 2049 for labels or 2051 "
                        f"for images)")
    ndim = _IDX_SHAPES[magic]
    head = 4 + 4 * ndim
    if len(data) < head:
        raise DataError(f"{path}: truncated IDX header ({len(data)} bytes)")
    shape = tuple(int.from_bytes(data[4 + 4 * k: 8 + 4 * k], "big") for k in range(ndim))
    expected = head + int(np.prod(shape))
    if len(data) != expected:
        what = "short" if len(data) < expected else "too long"
        raise DataError(f"{path}: IDX data {what}: shape {shape} needs {expected} bytes, file has "
                        f"{len(data)}")
    return np.frombuffer(data, dtype=np.uint8, offset=head).reshape(shape).copy()


def _find_mnist(directory: Path, stem: str) -> Path:
    for name in (stem, f"{stem}.gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise DataError(f"{directory}: no {stem} or {stem}.gz file (found: "
                    f"{', '.join(sorted(p.name for p in directory.iterdir())) or 'nothing'})")


def read_mnist(directory: str | Path) -> tuple[Table, Table]:
    """MNIST train and test Tables: X raw pixels 0..255 (float64, 784 columns), y digits 0..9."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: is not a directory with MNIST IDX files")
    tables = []
    for split, prefix in (("train", "train"), ("test", "t10k")):
        img_path = _find_mnist(directory, f"{prefix}-images-idx3-ubyte")
        lab_path = _find_mnist(directory, f"{prefix}-labels-idx1-ubyte")
        images, labels = read_idx(img_path), read_idx(lab_path)
        if images.ndim != 3 or labels.ndim != 1:
            raise DataError(f"{img_path}: expected images (magic 2051) and labels (magic 2049)")
        if images.shape[0] != labels.shape[0]:
            raise DataError(f"{img_path}: {images.shape[0]} images but {lab_path} has "
                            f"{labels.shape[0]} labels")
        if labels.size and labels.max() > 9:
            raise DataError(f"{lab_path}: label {int(labels.max())} is not a digit 0..9")
        X = images.reshape(images.shape[0], -1).astype(np.float64)
        info = {"reader": "mnist", "split": split, "files": [_file_record(img_path), _file_record(lab_path)],
                "n_rows": int(X.shape[0]), "image_shape": list(images.shape[1:]),
                "label_counts": np.bincount(labels, minlength=10).tolist()}
        tables.append(Table(X=X, y=labels.astype(np.float64),
                            feature_names=[f"px{j}" for j in range(X.shape[1])], target="digit",
                            keys={}, info=info))
    return tables[0], tables[1]
