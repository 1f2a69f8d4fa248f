"""matplotlib for the scripts that draw figures (`docs/plot_staleness.py`, `bench/stability.py`), when it is there.

matplotlib is not a dependency of drmas (it is the `bench` extra), and a plot is never the only output: a
script writes its numbers first and then the picture, or, without matplotlib, says in one line how to get it
instead of ending in a traceback after minutes of work.
"""

from __future__ import annotations

import importlib.util
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
