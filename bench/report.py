"""What the training benchmarks (`stability.py`, `learning.py`) share: the commit they ran at, and how a result
is written: JSON first, then its markdown table (also printed), then the picture, so that a missing matplotlib
(the `bench` extra) costs only the picture."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Callable


def commit() -> str:
    """The checkout's HEAD, or "unknown" outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_report(result: dict, out: Path, name: str, table: str, plot: Callable[[dict, Path], bool],
                 png: Path | None) -> None:
    """OUT/<name>.json and OUT/<name>.md, the table printed, and the plot to `png` (if given)."""
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, allow_nan=True))
    (out / f"{name}.md").write_text(table + "\n")
    print(table)
    if png is not None and plot(result, png):  # without matplotlib: one line on how to get it
        print(f"\nplot: {png}")


def add_output_args(parser: argparse.ArgumentParser, name: str) -> None:
    """--out, --png, --replot and the trailing `key=value` config overrides of a training benchmark."""
    parser.add_argument("--out", default=f"runs/{name}")
    parser.add_argument("--png", help=f"where the plot goes (default OUT/{name}.png)")
    parser.add_argument("--replot", metavar="OUT", help=f"only redo the table and plot from OUT/{name}.json")
    parser.add_argument("overrides", nargs="*")


def replot(args: argparse.Namespace, name: str, write: Callable[[dict, Path, Path], None]) -> bool:
    """With --replot OUT: the table and plot again from OUT/<name>.json (True: nothing else to do)."""
    if not args.replot:
        return False
    out = Path(args.replot)
    write(json.loads((out / f"{name}.json").read_text()), out, Path(args.png or out / f"{name}.png"))
    return True
