"""Plugins: the user's modules, imported in every drmas process before its config is read.

A plugin registers orchestras, role agents, tasks, engines or retrievers into the registries (importing only
`drmas.api`), so a config chooses them by name like the built-ins. Two ways to name one:

* the config's `plugins` list: module names (``my_pkg.my_mas``, importable where the process runs) or .py
  file paths (made absolute when the config is read, relative to the config file's directory; see
  `drmas.config.load.read_layers`);
* the ``drmas.plugins`` entry-point group of an installed package (``[project.entry-points."drmas.plugins"]
  my_mas = "my_pkg.my_mas"``): imported in every process, whatever the config.

`drmas.assembly.load_config`, the loader of every entry point (`drmas run` and its launchers, every learner
rank, every rollout, `drmas eval`, the colocated loop), imports them before it reads `system.*` and `task.*`
with the settings classes they register, so a plugin that cannot be imported (missing module or file, a
syntax error, an exception while importing, a name it registers twice) is one ConfigError naming the key and
the plugin, and `drmas run` exits 2 before any process starts. The buffer needs none of a plugin's code: it
reads its config with `drmas.config.read_config` and does not import them.

A file plugin is imported as a module named after its file (``my_mas.py`` -> ``my_mas``; a name another
importable module has is refused, rather than shadowing it), so its settings dataclasses and anything it
pickles resolve like a normal module's; its directory is appended to
``sys.path``, so modules beside it can be imported from it (appended: they never shadow an installed module).
Importing is idempotent: a process that loads its config twice imports each plugin once.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from typing import Sequence

from drmas.config.errors import ConfigError
from drmas.config.load import PluginSpec

ENTRY_POINT_GROUP = "drmas.plugins"


def import_plugins(specs: Sequence[PluginSpec]) -> None:
    """Import the installed entry points' modules, then `specs` in order; ConfigError naming the first that
    fails (`plugins[1]: ./my_mas.py: ...`)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        _guarded(f"entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP})", ep.load)
    for spec in specs:
        label = spec.key + ": " + (spec.written if spec.written == spec.target else f"{spec.written} ({spec.target})")
        if spec.is_file:
            _guarded(label, lambda: import_file(Path(spec.target)))
        else:
            _guarded(label, lambda: importlib.import_module(spec.target))


def import_file(path: Path):
    """The module of a plugin file, imported once per process under its file's name."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    name = path.stem
    if not name.isidentifier():
        raise ValueError(f"{path.name!r} cannot be a module name; name the file like a Python module (my_mas.py)")
    existing = sys.modules.get(name)
    if existing is not None:
        if Path(getattr(existing, "__file__", "") or "").resolve() == path.resolve():
            return existing
        raise ValueError(f"the module name {name!r} is taken by {getattr(existing, '__file__', None) or 'a built-in module'}"
                         "; rename the plugin file")
    other = importlib.util.find_spec(name)  # not imported yet, but importable: the plugin would shadow it
    if other is not None and Path(other.origin or "").resolve() != path.resolve():
        raise ValueError(f"the module name {name!r} is taken by {other.origin or 'a namespace package'}; rename the "
                         "plugin file")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _guarded(label: str, load) -> None:
    try:
        load()
    except (Exception, SystemExit) as exc:
        raise ConfigError(f"{label}: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    """One line: the exception and, for one raised inside the plugin's code, where."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({Path(exc.filename or '?').name}, line {exc.lineno})"
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if "importlib" not in f.filename and not f.filename.endswith("drmas/plugins.py")]
    if inside:
        text += f" (at {Path(inside[-1].filename).name}:{inside[-1].lineno})"
    return text
