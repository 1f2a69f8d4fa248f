"""`help_field`: the one way a config dataclass field carries its help text.

Every config section (`drmas.config.schema` and the sections that live beside the subsystem they tune:
buffer, weights, retrieval, restarts, launch) declares its fields with it, so `drmas config keys` finds the
help of every knob in the same place. It lives outside `drmas.config` because the schema imports those
sections, which could then not import a helper from it.
"""

from __future__ import annotations

import copy
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
