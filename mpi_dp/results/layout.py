"""The layout of a result file as Markdown: every dataset of a configuration group with its
dimensions, type, whether it is evaluation-only and what it holds, and the group's attributes.
docs/results.md holds one such section per method, generated from real result files and
checked against them by tests/test_results_doc.py (so the document cannot drift from the files).

    python -m mpi_dp.results.layout RESULT.h5 [RESULT.h5 ...]   # prints the sections
"""

from __future__ import annotations

import sys
from pathlib import Path

import h5py

from .. import strict_json

BEGIN, END = "<!-- layout:{} begin (generated) -->", "<!-- layout:{} end -->"


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _dims(ds: h5py.Dataset) -> str:
    if ds.is_scale:
        return f"{ds.name.rsplit('/', 1)[-1]} (coordinate)"
    return ", ".join(d.label or "?" for d in ds.dims) if ds.ndim else "(scalar)"


def _dtype(ds: h5py.Dataset) -> str:
    if ds.dtype.names:
        return "compound: " + ", ".join(ds.dtype.names)
    if h5py.check_string_dtype(ds.dtype) is not None:
        return "text"
    return str(ds.dtype)


def section(path: str | Path) -> str:
    """The Markdown section of one result file's algorithm: the first configuration group."""
    with h5py.File(path, "r", locking=False) as f:
        algorithm = _text(f.attrs["algorithm"])
        g = f["configs/000"] if "configs" in f else f
        rows: list[tuple[str, str, str, str, str]] = []

        def visit(name: str, obj) -> None:
            if isinstance(obj, h5py.Dataset) and not name.startswith(("configs", "provenance")):
                ev = obj.attrs.get("evaluation_only")
                rows.append((name, _dims(obj), _dtype(obj),
                             "?" if ev is None else "yes" if ev else "no",
                             _text(obj.attrs.get("long_name", "")).replace("|", "/")
                             .replace("\n", " ")))

        g.visititems(visit)
        rows.sort(key=lambda r: (r[0].count("/"), r[0].split("/")[0], r[0]))
        attrs = sorted(g.attrs)
        ev_attrs = strict_json.loads(g.attrs.get("evaluation_only_attrs", "[]"))
    lines = [BEGIN.format(algorithm), f"### {algorithm}", "",
             "| dataset | dimensions | type | evaluation-only | long name |",
             "|---|---|---|---|---|"]
    lines += [f"| `{p}` | {d} | {t} | {e} | {n} |" for p, d, t, e, n in rows]
    lines += ["", "Attributes of the configuration group: " + ", ".join(f"`{a}`" for a in attrs)
              + ".", "", "Evaluation-only among them: "
              + (", ".join(f"`{a}`" for a in ev_attrs) or "none") + ".", END.format(algorithm)]
    return "\n".join(lines)


def replace_section(doc: str, text: str, algorithm: str) -> str:
    """`doc` with the generated section of `algorithm` replaced by `text` (appended if absent)."""
    b, e = BEGIN.format(algorithm), END.format(algorithm)
    if b in doc and e in doc:
        head, rest = doc.split(b, 1)
        return head + text + rest.split(e, 1)[1]
    return doc.rstrip("\n") + "\n\n" + text + "\n"


def current_section(doc: str, algorithm: str) -> str | None:
    b, e = BEGIN.format(algorithm), END.format(algorithm)
    if b not in doc or e not in doc:
        return None
    return b + doc.split(b, 1)[1].split(e, 1)[0] + e


def main(argv: list[str] | None = None) -> int:
    for p in argv if argv is not None else sys.argv[1:]:
        print(section(p) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
