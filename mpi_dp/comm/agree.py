"""Agreement on user errors across ranks: every rank raises the same error, nobody waits."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from mpi4py import MPI

from ..errors import MpiDpError

T_ = TypeVar("T_")


class AgreedError(MpiDpError):
    """A user error that every rank raises together (no rank is left waiting)."""


def collective(comm: MPI.Comm, fn: Callable[[], T_]) -> T_:
    """Run fn on every rank; if it raises a user error on any rank, raise it on all ranks.

    Only MpiDpError is a user error (code that reads user input turns its OSError, ValueError
    or KeyError into one, naming the file or key); anything else is a bug and propagates: the
    CLI prints its rank-tagged traceback and stops every rank.
    """
    result, err = None, None
    try:
        result = fn()
    except MpiDpError as e:
        err = str(e)
    errors = comm.allgather(err)
    first = next((e for e in errors if e), None)
    if first:
        raise AgreedError(first)
    return result  # type: ignore[return-value]
