"""`drmas new-system NAME [--dir DIR]`: write a runnable plugin skeleton and its config.

The skeleton (`system_template.py` / `system_template.yaml` here, the name `template_system` replaced) is a
complete plugin: a registered orchestra with a settings class, two role agents, per-agent rewards, on the
built-in arithmetic task and a tiny random model, so `drmas run --config DIR/NAME.yaml` trains it as written
(tests/test_new_system.py does). The template is a real module of this package (linted, imports checked), never
imported: it is read as text.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import sys
from pathlib import Path

PLACEHOLDER = "template_system"
_TEMPLATES = Path(__file__).resolve().parent


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def problem_with(name: str) -> str | None:
    """Why `name` cannot be a new system's name (its module's and its registered name), or None."""
    if not name.isidentifier() or keyword.iskeyword(name):
        return f"{name!r} is not a Python identifier (it names the plugin's module, e.g. my_system)"
    from drmas.mas import ORCHESTRAS
    import drmas.assembly  # noqa: F401  (registers the built-in systems)

    if name in ORCHESTRAS:
        return f"{name!r} is the name of a registered system; choose another"
    if name in sys.modules or importlib.util.find_spec(name) is not None:
        return f"a module named {name!r} is importable already, so the plugin file could not be imported under it"
    return None


def new_system(name: str, directory: Path, force: bool = False) -> tuple[Path, Path]:
    """Write DIR/NAME.py and DIR/NAME.yaml; ValueError when the name is unusable or a file exists (unless force)."""
    problem = problem_with(name)
    if problem:
        raise ValueError(problem)
    targets = {suffix: directory / f"{name}{suffix}" for suffix in (".py", ".yaml")}
    existing = [str(path) for path in targets.values() if path.exists()]
    if existing and not force:
        raise ValueError(f"already there: {', '.join(existing)} (--force replaces)")
    directory.mkdir(parents=True, exist_ok=True)
    for suffix, path in targets.items():
        text = (_TEMPLATES / f"system_template{suffix}").read_text()
        path.write_text(text.replace(camel(PLACEHOLDER), camel(name)).replace(PLACEHOLDER, name))
    return targets[".py"], targets[".yaml"]


def add_parser(sub) -> None:
    p = sub.add_parser("new-system", help="write a runnable plugin skeleton (a system of your own) and its config")
    p.add_argument("name", help="the system's name: its registered name and its module's (a Python identifier)")
    p.add_argument("--dir", default=".", help="where to write NAME.py and NAME.yaml (default: here)")
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        module, config = new_system(args.name, Path(args.dir), args.force)
    except ValueError as exc:
        print(f"drmas new-system: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {module} (the system: orchestra, roles, settings) and {config} (its config)\n"
          f"train it: drmas run --config {config}\nthen make it yours: docs/extending.md")
    return 0
