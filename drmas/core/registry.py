"""A tiny name -> factory registry: drmas' one extension mechanism.

Engines, launchers, retrievers, orchestras, role agents and tasks are chosen by name from the config; each
kind has one registry, filled by the built-ins and by plugins alike with one decorator, so the choice stays
data-driven (no if/else chains over backends in the callers).

A registry may keep a settings class per name beside the factories (`Registry(kind, settings=...)`): the
orchestras and tasks do, so `system.*` and `task.*` are typed and checked by the chosen system's or task's
own settings class (`drmas.config.sections`). One decorator registers both: `register(name, settings=C)`.
A registry may also take `traits` per name (`Registry(kind, traits=T)`, `register(name, traits=T(...))`): what a
component declares about itself that its callers must know before building it -- an engine's abilities
(`drmas.engines.base.EngineAbilities`), read by the config check without importing the engine.
A name is registered once: a second registration (a plugin choosing a built-in's name) is an error naming
the module that holds the name, never a silent replacement.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Generic, Optional, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories of one kind of component (the kind is named for error messages)."""

    def __init__(self, kind: str, settings: Optional["Registry[Any]"] = None, traits: Optional[type] = None) -> None:
        self.kind = kind
        self.settings = settings  # name -> settings class, filled by `register(name, settings=...)`
        self.traits_type = traits  # the class of what a name declares about itself (None: nothing)
        self._items: dict[str, T] = {}
        self._traits: dict[str, Any] = {}

    def register(self, name: str, settings: Any = None, traits: Any = None) -> Callable[[T], T]:
        """Decorator registering a factory as `name`; `settings`: its settings class (registries that keep
        them only; None: the settings registry's base class); `traits`: what it declares about itself, an
        instance of the registry's traits class (None: that class's defaults)."""
        if settings is not None and self.settings is None:
            raise TypeError(f"a {self.kind} takes no settings class (got {settings!r} for {name!r})")
        if traits is not None and not (self.traits_type and isinstance(traits, self.traits_type)):
            expected = self.traits_type.__name__ if self.traits_type else "none"
            raise TypeError(f"{self.kind} {name!r}: traits must be a {expected}, got {traits!r}")

        def decorator(item: T) -> T:
            self._refuse_taken(name)
            if self.settings is not None:
                self.settings.adopt(name, settings)
            self._items[name] = item
            if self.traits_type is not None:
                self._traits[name] = traits if traits is not None else self.traits_type()
            return item

        return decorator

    def traits(self, name: str) -> Any:
        """What `name` declared when it was registered (KeyError naming the known names if it is not)."""
        self.get(name)
        return self._traits[name]

    def adopt(self, name: str, item: Any) -> None:
        """Register `item` as `name` unless that very item is registered there already."""
        if self._items.get(name) is not item:
            self.register(name)(item)

    def _refuse_taken(self, name: str) -> None:
        if name in self._items:
            holder = getattr(self._items[name], "__module__", None) or "?"
            raise ValueError(f"{self.kind} {name!r} is already registered (by {holder}); a name cannot be "
                             "registered twice, so register yours under another name")

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
