"""Blocks of a sweep's configurations: `mpi-dp run --configs A:B` / `--config-block I/N` run one
block into its own part file, `mpi-dp merge` combines the parts (mpi_dp.results.merge).

Block I of N holds the configurations [I*C//N, (I+1)*C//N) of a job with C configurations (some
blocks are empty when N > C). `--task-file` names a block's part OUT.taskI.h5 (`task_path`).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from ..errors import JobError


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """What the command line asked for: a range A:B (either end may be open) or block I of N."""

    start: int | None = None
    stop: int | None = None
    task: tuple[int, int] | None = None  # (I, N) of --config-block

    def resolve(self, n_configs: int) -> tuple[int, int]:
        """The half-open range of configuration indices; JobError if it does not fit the job."""
        if self.task is not None:
            i, n = self.task
            return i * n_configs // n, (i + 1) * n_configs // n
        lo = 0 if self.start is None else self.start
        hi = n_configs if self.stop is None else self.stop
        if not 0 <= lo <= hi <= n_configs:
            raise JobError(f"--configs {self.text()}: the job has {n_configs} configuration(s), "
                           f"indices 0..{n_configs - 1}; give A:B with 0 <= A <= B <= {n_configs}")
        return lo, hi

    def text(self) -> str:
        if self.task is not None:
            return f"{self.task[0]}/{self.task[1]}"
        return f"{'' if self.start is None else self.start}:{'' if self.stop is None else self.stop}"


def parse_configs(text: str) -> BlockSpec:
    """argparse type of --configs: 'A:B' (half-open, 0-based; 'A:' and ':B' open) or 'A'."""
    m = re.fullmatch(r"\s*(\d*)\s*(:?)\s*(\d*)\s*", text)
    if not m or (not m.group(2) and not m.group(1)) or (not m.group(2) and m.group(3)):
        raise argparse.ArgumentTypeError(f"{text!r}: give A:B (configurations A..B-1, 0-based), "
                                         "A: or :B, or one index A")
    a = int(m.group(1)) if m.group(1) else None
    if not m.group(2):
        return BlockSpec(a, a + 1)  # type: ignore[operator]
    b = int(m.group(3)) if m.group(3) else None
    if a is not None and b is not None and b < a:
        raise argparse.ArgumentTypeError(f"{text!r}: the end B is before the start A")
    return BlockSpec(a, b)


def parse_block(text: str) -> BlockSpec:
    """argparse type of --config-block: 'I/N', block I (0-based) of N."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise argparse.ArgumentTypeError(f"{text!r}: give I/N with 0 <= I < N (block I of N, "
                                         "e.g. 0/4)")
    return BlockSpec(task=(int(m.group(1)), int(m.group(2))))


def task_path(final: str | Path, i: int) -> Path:
    """The part file of block I of a job whose result is `final`: results/x.h5 -> x.taskI.h5."""
    final = Path(final)
    return final.with_name(f"{final.stem}.task{i}{final.suffix}")


def task_glob(final: str | Path) -> str:
    """The glob of every task file of `final` (what `mpi-dp merge OUT` reads by default)."""
    final = Path(final)
    return f"{final.stem}.task*{final.suffix}"


def ranges_text(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out: list[str] = []
    for i in sorted(indices):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)
