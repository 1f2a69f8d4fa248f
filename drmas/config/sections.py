"""The `system` and `task` sections: typed by the settings class of the system or task they name.

Every system (orchestra) and task declares its own settings: a dataclass subclassing `SystemSettings` or
`TaskSettings`, its fields declared with `help_field` and its checks in `problems(where)`, like every other
section. Registering an orchestra or task registers its settings class under the same name
(`ORCHESTRAS.register("debate", settings=DebateSettings)`), in `SYSTEM_SETTINGS` / `TASK_SETTINGS` here;
the config loader then reads `system.*` with the class `system.name` selects (unknown keys refused with a
did-you-mean hint, wrong types named by key, `problems` reported with the other checks), so a plugin's
settings behave exactly like the built-ins'. The built-ins' classes live in `drmas.config.systems` and
`drmas.config.tasks` and are registered here at import, so every process (the buffer too) reads a built-in
config without importing the systems it names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from drmas.config.fields import Section
from drmas.config.fields import help_field as _f
from drmas.core.registry import Registry


class _Named(Section):
    @classmethod
    def name_field(cls, name: str) -> Any:
        """The `name` field of a subclass, defaulting to the name it is registered under (so a settings object
        made in code, `SearchSettings()`, names its own system), with the base's help text."""
        return _f(name, cls.__dataclass_fields__["name"].metadata["help"])


@dataclass
class SystemSettings(_Named):
    """What every multi-agent system's settings have: the system's name. A system's own settings subclass it
    (a system without settings of its own takes `system.name` alone)."""

    name: str = _f("math", "Registered multi-agent system (orchestra): built-in 'math' (solver/verifier), "
                   "'math_revise' (solver, task-graded check, reviser only after a wrong answer), 'search' "
                   "(router/searcher/answerer) or 'external' (an agent program of your own calling an OpenAI-compatible "
                   "gateway, docs/gateway.md); a plugin's systems are chosen the same way. The other system.* keys "
                   "are that system's settings (`drmas config keys` lists them per system).")


@dataclass
class TaskSettings(_Named):
    """What every task's settings have: the task's name. A task's own settings subclass it."""

    name: str = _f("arithmetic", "Registered task: built-in 'arithmetic' (generated math), 'math_file' (math "
                   "jsonl/parquet files), 'multihop' (generated multi-hop QA world with its passage corpus) or "
                   "'qa_file' (Search-R1 QA jsonl/parquet files); a plugin's tasks are chosen the same way. The "
                   "other task.* keys are that task's settings.")


class SettingsRegistry(Registry[type]):
    """Name -> settings class of one section; every class a dataclass subclassing `base`."""

    def __init__(self, section: str, base: type) -> None:
        super().__init__(f"{section} settings class")
        self.section = section
        self.base = base

    def adopt(self, name: str, item: Any) -> None:
        cls = self.base if item is None else item
        # `__dataclass_fields__` of its own: a subclass without @dataclass would inherit its base's and keep its
        # annotated settings as plain class attributes, which no config could set
        if not (isinstance(cls, type) and issubclass(cls, self.base) and "__dataclass_fields__" in vars(cls)):
            raise TypeError(f"the settings of {self.section} {name!r} must be a @dataclass subclassing "
                            f"{self.base.__name__}, got {item!r}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise TypeError(f"{cls.__name__} ({self.section} {name!r}): every setting needs a default "
                            f"(help_field(default, help)); {', '.join(missing)} has none")
        super().adopt(name, cls)

    def of(self, name: Any) -> Optional[type]:
        """The settings class registered as `name` (None: no such name, e.g. a plugin not imported here)."""
        return self._items.get(name) if isinstance(name, str) else None

    def owners(self, key: str) -> list[str]:
        """Names whose settings have the field `key` (a key of another system/task than the chosen one)."""
        return sorted(n for n, cls in self._items.items() if key in {f.name for f in dataclasses.fields(cls)})


SYSTEM_SETTINGS = SettingsRegistry("system", SystemSettings)
TASK_SETTINGS = SettingsRegistry("task", TaskSettings)
SECTIONS: dict[str, SettingsRegistry] = {"system": SYSTEM_SETTINGS, "task": TASK_SETTINGS}
