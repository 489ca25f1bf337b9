"""The registry of methods: the one place that lists them."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

from ..errors import JobError
from ..jobspec import GENERIC, GENERIC_SECTIONS, SHARED, SHARED_SECTIONS
from .base import Method


class Registry:
    """Methods by name; `add` checks that a new method does not clash with the shared keys."""

    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}

    @classmethod
    def from_modules(cls, modules: Iterable[str]) -> Registry:
        """A registry of the `METHOD` of each module (dotted names)."""
        reg = cls()
        for name in modules:
            reg.add(importlib.import_module(name).METHOD)
        return reg

    def add(self, method: Method) -> Method:
        if not method.name or method.name in self._methods:
            raise ValueError(f"method name {method.name!r} is empty or registered twice")
        if not method.variants:
            raise ValueError(f"method {method.name!r} declares no variant")
        taken = set(GENERIC) | set(SHARED) | set(GENERIC_SECTIONS) | set(SHARED_SECTIONS)
        for m in self._methods.values():
            taken |= set(m.sections)
        clash = taken & set(method.sections)
        if clash:
            raise ValueError(f"method {method.name!r}: section(s) {sorted(clash)} already exist")
        fixed = set(GENERIC_SECTIONS.get("sweep", {})) | set(SHARED_SECTIONS.get("sweep", {}))
        for key in method.sweeps:
            sec, _, name = key.partition(".")
            if sec not in method.sections or name not in method.sections[sec] or name in fixed:
                raise ValueError(f"method {method.name!r}: sweep key {key!r} is not one of its "
                                 "own keys or clashes with a generic sweep axis")
        self._methods[method.name] = method
        return method

    def get(self, name: str) -> Method:
        try:
            return self._methods[name]
        except KeyError:
            raise JobError(f"unknown algorithm {name!r}; known: "
                           f"{', '.join(self._methods)}") from None

    def specs(self) -> Mapping[str, Method]:
        return dict(self._methods)

    def names(self) -> list[str]:
        return list(self._methods)
