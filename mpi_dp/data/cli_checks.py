"""What `mpi-dp data prepare` and `mpi-dp data synth` check before anything is read or written.

Data files are results too: results computed from a shard name it (data_path, data_sha256), so
an existing --out is never replaced without --overwrite; every numeric option declares its range
(`Range`: the argparse ``type=`` that parses it, and `check_ranges`, which refuses a value outside
it naming the option, the value and the range); and under a launcher (mpiexec, srun) only rank 0
does the work, so that N ranks neither write the file N times nor print N summaries.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mpi_dp.errors import DataError

#: environment variables that launchers set to a process's rank (MPICH/Intel MPI/MVAPICH hydra,
#: PMIx, Open MPI, Slurm's srun), first found wins
RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
                  "SLURM_PROCID")


@dataclasses.dataclass(frozen=True)
class Range:
    """A numeric option's range: `kind` int or float (finite), from `lo` to `hi` (None: open
    ended), each bound excluded when `lo_open` / `hi_open`; `what` words it when the generic
    text ("an integer >= 1") says less. Called, it parses the option's text (argparse type=)."""

    kind: type = int
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    what: str = ""

    def __call__(self, text: str) -> int | float:
        try:
            return self.kind(text)
        except ValueError:
            name = "int" if self.kind is int else "float"
            raise argparse.ArgumentTypeError(f"invalid {name} value: {text!r}") from None

    @property
    def text(self) -> str:
        """The range in words: 'an integer >= 1', 'a number in [0, 1)', 'a finite number > 0'."""
        if self.what:
            return self.what
        noun = "an integer" if self.kind is int else "a number"
        if self.lo is not None and self.hi is not None:
            return (f"{noun} in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}"
                    f"{')' if self.hi_open else ']'}")
        noun = noun if self.kind is int else "a finite number"
        if self.lo is not None:
            return f"{noun} {'>' if self.lo_open else '>='} {self.lo:g}"
        if self.hi is not None:
            return f"{noun} {'<' if self.hi_open else '<='} {self.hi:g}"
        return noun

    def holds(self, value: Any) -> bool:
        """Whether one value is of the kind and in the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return not (self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi))

    def check(self, name: str, value: Any, sep: str = " ") -> None:
        """DataError naming `name`, the value (after `sep`) and the range when `value` (a number,
        or a list of numbers each in the range) is outside it; None passes (not given)."""
        if value is None:
            return
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        bad = next((v for v in values if not self.holds(v)), None)
        if bad is None and values:
            return
        shown = " ".join(map(str, values)) if isinstance(value, (list, tuple)) else str(value)
        each = f"{bad} is out of range: each must be" if len(values) > 1 else "must be"
        raise DataError(f"{name}{sep}{shown}: {each} {self.text}")


def add_number(group: Any, flag: str, rng: Range, ranges: dict[str, Range], help: str,
               **kw: Any) -> argparse.Action:
    """`group.add_argument(flag, type=rng, ...)` with the range said in the help and recorded in
    `ranges` under the option's dest (for `check_ranges`)."""
    action: argparse.Action = group.add_argument(flag, type=rng, help=f"{help} [{rng.text}]", **kw)
    ranges[action.dest] = rng
    return action


def check_ranges(args: argparse.Namespace, ranges: Mapping[str, Range]) -> None:
    """Every ranged option of `args` in its range (DataError naming the first that is not)."""
    for dest, rng in ranges.items():
        rng.check("--" + dest.replace("_", "-"), getattr(args, dest, None))


def launcher_rank() -> int:
    """This process's rank under mpiexec / srun (from the launcher's environment), 0 outside
    one. Read from the environment: the data commands do not start MPI."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def refuse_existing(out: str | os.PathLike[str], overwrite: bool, command: str) -> None:
    """Refuse to replace an existing shard file without --overwrite, in the words of `mpi-dp
    run` (mpi_dp.results.output.check_output): results computed from it name it. A directory is
    refused too (the writer's message, before anything is read)."""
    path = Path(out)
    if path.is_dir():
        raise DataError(f"output {path} is a directory; give the shard file's path, e.g. "
                        f"{path / 'data.h5'}")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise DataError(f"{path} exists: `mpi-dp {command}` never replaces a result (results "
                        "computed from a shard file name it); pass --overwrite to replace it "
                        "(the old file stays until the new one is complete) or choose another "
                        "--out")


OVERWRITE_HELP = ("replace an existing --out (the old file stays until the new one is "
                  "complete); without it an existing file is refused: results computed from it "
                  "name it by path and SHA-256")
