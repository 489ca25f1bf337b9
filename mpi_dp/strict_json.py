"""Strict JSON (RFC 8259) for text attributes of result files and job records: a non-finite
number is written as the string "Infinity", "-Infinity" or "NaN", which strict readers (JSON.parse,
jq, serde) accept, and `loads` reads those strings back as floats."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

NONFINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _plain(v: Any) -> Any:
    if isinstance(v, float | np.floating):
        f = float(v)
        if math.isfinite(f):
            return f
        return "NaN" if math.isnan(f) else ("Infinity" if f > 0 else "-Infinity")
    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, int | np.integer):
        return int(v)
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set | frozenset):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, str):
        return v
    return str(v)


def dumps(value: Any, **kw: Any) -> str:
    """Strict JSON text of `value`: non-finite floats as "Infinity" / "-Infinity" / "NaN",
    NumPy scalars and arrays as numbers and lists, anything else as its str."""
    return json.dumps(_plain(value), allow_nan=False, **kw)


def _finite_back(v: Any) -> Any:
    if isinstance(v, str):
        return NONFINITE.get(v, v)
    if isinstance(v, list):
        return [_finite_back(x) for x in v]
    if isinstance(v, dict):
        return {k: _finite_back(x) for k, x in v.items()}
    return v


def loads(text: str | bytes) -> Any:
    """Parse a JSON attribute: the strings "Infinity", "-Infinity", "NaN" become floats (files
    of earlier versions wrote the non-standard bare tokens, which Python also reads)."""
    if isinstance(text, bytes):
        text = text.decode()
    return _finite_back(json.loads(text))
