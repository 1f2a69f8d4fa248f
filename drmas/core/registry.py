"""A tiny name -> factory registry: drmas' one extension mechanism.

Engines, launchers, retrievers, orchestras, role agents and tasks are chosen by name from the config; each
kind has one registry, filled by the built-ins and by plugins alike with one decorator, so the choice stays
data-driven (no if/else chains over backends in the callers).
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories of one kind of component (the kind is named for error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = item
            return item

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}{self._hint(name)}") from None

    def lookup(self, name: str, key: str) -> T:
        """The item registered as `name`, chosen by config key `key`; ValueError naming the key otherwise."""
        problem = self.problem(name, key)
        if problem:
            raise ValueError(problem)
        return self._items[name]

    def problem(self, name: str, key: str) -> str | None:
        """What is wrong with choosing `name` at config key `key` (None: it is registered)."""
        if name in self._items:
            return None
        return f"{key}: {name!r} is not a registered {self.kind}{self._hint(name)}"

    def _hint(self, name: str) -> str:
        close = difflib.get_close_matches(str(name), self._items, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{hint}; known: {', '.join(sorted(self._items)) or 'none'}"

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
