"""The `mpi-dp data synth` commands written in the job files and READMEs are whole commands that
the CLI accepts, and every command writing a job's data file makes the same file wherever it is
written down (a user following the README gets the job's documented data)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import tomllib

from mpi_dp.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _synth_commands(path: Path) -> list[list[str]]:
    """Every `mpi-dp data synth ...` command of a file, continuation lines joined; comment
    markers, backquotes and shell loops stripped."""
    text = path.read_text()
    text = re.sub(r"\\\n\s*#?\s*", " ", text)  # join `\` continuations (also inside comments)
    out = []
    for m in re.finditer(r"mpi-dp data synth[^\n`;]*", text):
        args = shlex.split(m.group(0), comments=True)[1:]
        out.append([a for a in args if a not in ("done",)])
    return out


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "jobs" / "README.md", *sorted((ROOT / "jobs").glob("*.toml"))]


def test_every_documented_synth_command_parses():
    parser = build_parser()
    seen = 0
    for doc in _documents():
        for args in _synth_commands(doc):
            if "--out" not in args or "$" in " ".join(args) or "P" in args:
                continue  # a placeholder (`--dim P`, `$p`), not a runnable command
            ns = parser.parse_args(args)
            assert ns.out, (doc, args)
            seen += 1
    assert seen >= 20


def test_commands_writing_a_jobs_data_file_agree_everywhere():
    parser = build_parser()
    by_out: dict[str, tuple[dict, Path]] = {}
    for doc in _documents():
        for args in _synth_commands(doc):
            if "--out" not in args or "$" in " ".join(args) or "P" in args:
                continue
            ns = vars(parser.parse_args(args))
            ns.pop("given_options", None)
            ns.pop("func", None)
            out = str(ns["out"])
            if out in by_out:
                first = by_out[out][1].relative_to(ROOT)
                assert ns == by_out[out][0], \
                    f"{doc.relative_to(ROOT)} and {first} make {out} with different options"
            else:
                by_out[out] = (ns, doc)
    jobs_data = set()
    for job in (ROOT / "jobs").glob("*.toml"):
        data = tomllib.loads(job.read_text()).get("data")
        if isinstance(data, str) and data.startswith("data/synth") and "{" not in data:
            jobs_data.add(data)
            assert data in by_out, f"{job.name}: no documented command makes {data}"
    assert jobs_data
