"""How a config section is written: `help_field` (each field with its help text) and `Section` (its checks).

Every config section (`drmas.config.schema` and the sections in modules of their own beside it: buffer,
weights, retrieval, restarts, ray, gpus) declares its fields with `help_field`, so `drmas config keys` finds
the help of every knob in the same place.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import field
from typing import Any


def help_field(default: Any, help: str) -> Any:
    """A dataclass field with `default` and its help text in `metadata["help"]`.

    A type (a section dataclass, `dict`) becomes the field's factory; a dict, list or set literal is copied
    for every instance, so no two configs share one mutable default."""
    if isinstance(default, type):
        return field(default_factory=default, metadata={"help": help})
    if isinstance(default, (dict, list, set)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


class Section:
    """A settings section that knows its own constraints, next to its fields: one home per setting.

    `problems(where)` lists everything wrong with the values, each message naming its key under `where`, the
    section's place in the config (``pipeline.buffer``), so a config check reports every mistake at once and
    a component given the section on its own (`validate`) fails the same way."""

    def problems(self, where: str) -> list[str]:
        return []

    def all_problems(self, where: str) -> list[str]:
        """`problems(where)` and those of every section nested in this one (a field holding a `Section`, e.g. a
        plugin system's `sandbox: SandboxConfig`), each under its own key (``system.sandbox.timeout_s``), so a
        settings class that embeds a section need not forward its checks."""
        found = list(self.problems(where))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Section):
                found.extend(value.all_problems(f"{where}.{f.name}"))
        return found

    def validate(self, where: str) -> None:
        """ValueError listing every problem, when there are any."""
        found = self.problems(where)
        if found:
            raise ValueError("; ".join(found))

    def at_least(self, where: str, **bounds: float) -> list[str]:
        """A problem for each field (named by keyword) below its lower bound: `at_least(where, max_rounds=1)`."""
        return [f"{where}.{name}: must be >= {low}, got {getattr(self, name)}"
                for name, low in bounds.items() if getattr(self, name) < low]

    def one_of(self, where: str, name: str, choices: tuple) -> list[str]:
        """A problem when field `name` is not one of `choices`."""
        value = getattr(self, name)
        if value in choices:
            return []
        return [f"{where}.{name}: {value!r} is not one of {', '.join(map(str, choices))}"]
