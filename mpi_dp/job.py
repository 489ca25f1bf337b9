"""Load a job file against the method registry: the loader the runner and the CLI use.

The key catalogue and the generic validation live in the leaf module `jobspec` (methods import
it for `Key` and `Job`); this module hands the registry's methods to it, so neither imports the
other in a circle.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .jobspec import Config, Job, Key, parse_override, resolve_per_owner
from .jobspec import describe_keys as _describe_keys
from .jobspec import read as _read
from .methods import REGISTRY

__all__ = ["Config", "Job", "Key", "describe_keys", "load_job", "parse_override",
           "resolve_per_owner"]


def load_job(path: str | Path, overrides: Sequence[str] = ()) -> Job:
    """Read, override and validate a job file for the method it names. Raises JobError."""
    return _read(path, overrides, REGISTRY.specs())


def describe_keys() -> str:
    """All job keys with defaults and help, generic first, then per method."""
    return _describe_keys(REGISTRY.specs())
