"""Tasks: sources of problems with a train/test split and a grader, chosen by name from the config.

`TASKS` is defined before the built-in task modules are imported because they register themselves into
it with `@TASKS.register(...)`; importing this package is therefore enough to make every built-in task
available to `build_task`.
"""

from __future__ import annotations

from typing import Callable

from drmas.config.sections import TASK_SETTINGS, TaskSettings
from drmas.core.registry import Registry
from drmas.tasks.base import Problem, Task

TaskFactory = Callable[[TaskSettings], Task]

# name -> task factory `(settings) -> Task`; `register(name, settings=C)` also makes C the settings class of
# `task.*` when `task.name` is that name
TASKS: Registry[TaskFactory] = Registry("task", settings=TASK_SETTINGS)

# Imported for their registration side effect; must come after TASKS exists.
from drmas.tasks import arithmetic, files, multihop, qa_files  # noqa: E402,F401


def build_task(cfg: TaskSettings) -> Task:
    """The task named by `cfg.name`, built from `cfg` (unknown names fail with the known ones listed)."""
    return TASKS.get(cfg.name)(cfg)


__all__ = ["TASKS", "Problem", "Task", "TaskFactory", "build_task"]
