"""matplotlib for the scripts that draw figures (`docs/plot_staleness.py`, `bench/stability.py`), when it is there.

matplotlib is not a dependency of drmas (it is the `bench` extra), and a plot is never the only output: a
script writes its numbers first and then the picture, or, without matplotlib, says in one line how to get it
instead of ending in a traceback after minutes of work.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Optional

INSTALL = "pip install 'drmas[bench]' (or: .venv/bin/pip install matplotlib)"


def pyplot(what: str) -> Optional[ModuleType]:
    """`matplotlib.pyplot` on the Agg backend (files only, no display), or None after printing one line that
    says `what` is not drawn and how to install matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        print(f"{what}: not drawn, matplotlib is not installed: {INSTALL}")
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(plt: ModuleType, fig, axes, png) -> None:
    """Grid and legend on every axis, then the figure to `png` (closed: scripts draw several in one process)."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def run_and_picture(description: str, run_help: str, picture: str) -> tuple[Path, Path]:
    """The command line of a script that plots one run: (the run directory, where its picture goes: `--out`,
    by default `<run>/<picture>`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("run", help=run_help)
    parser.add_argument("--out", help=f"where the picture goes (default: RUN/{picture})")
    args = parser.parse_args()
    run = Path(args.run)
    return run, Path(args.out) if args.out else run / picture
