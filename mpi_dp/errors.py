"""Exceptions that carry a user-facing message; the CLI prints them without a traceback."""

from __future__ import annotations

from pathlib import Path


class MpiDpError(Exception):
    """Base class: an error whose message is meant for the user."""


class JobError(MpiDpError):
    """An invalid job file or --set override; the message names the key and the file."""


class ShardError(MpiDpError):
    """A missing, malformed or inconsistent HDF5 shard file; the message names the file."""


class DataError(MpiDpError):
    """A dataset that cannot be read or prepared; the message names the file and the problem."""


class BudgetExceededError(MpiDpError):
    """A data owner refused a release that would exceed its privacy budget."""


class NumericalError(MpiDpError):
    """A NaN or infinity appeared where a finite number is required."""


class ProtocolError(MpiDpError):
    """A message between the learner and an owner's host broke the protocol (wrong echo, tag)."""


class MergeError(MpiDpError):
    """Part files that cannot be merged into one result (mpi-dp merge); the message says why."""


class DiskFullError(MpiDpError):
    """The file system of a result file ran out of space; what was complete stays readable."""


class ResultError(MpiDpError, KeyError):
    """A result file lacks what was asked of it (a metric, a configuration). Also a KeyError, for
    code that looks things up; its message is the plain text (not a KeyError's quoted repr)."""

    __str__ = BaseException.__str__


def unwritable_why(path: Path, exc: OSError) -> str:
    """Why `path`'s folder could not be made (its mkdir raised `exc`), for a user: the ancestor
    that is a file, not a directory, or the system's reason with the path it names."""
    blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    return (f"{blocker} is a file, not a directory" if blocker is not None else
            f"{exc.strerror or exc} ({exc.filename or path.parent})")
