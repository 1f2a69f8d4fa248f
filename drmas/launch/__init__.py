"""`drmas run` with `pipeline.mode=async`: start the pipeline's processes with the launcher the config names.

`pipeline.launcher` picks one of `LAUNCHERS`: `local` (OS processes of this machine, `drmas.launch.local`) or
`ray` (Ray actors placed on a cluster, `drmas.launch.ray_launcher`). Both share the run around the processes
(`drmas.launch.supervisor`); a backend module is imported only when chosen, so Ray stays an optional extra.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # the schema imports drmas.launch.ray_config: no import of it at run time here
    from drmas.config.schema import DrmasConfig

LAUNCHERS = {"local": "drmas.launch.local:LocalLauncher", "ray": "drmas.launch.ray_launcher:RayLauncher"}


def launch(cfg: "DrmasConfig", out: TextIO = sys.stdout) -> int:
    module, name = LAUNCHERS[cfg.pipeline.launcher].split(":")
    try:
        launcher = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        print(f"drmas: pipeline.launcher={cfg.pipeline.launcher} needs a package that is not installed ({exc}); "
              f"pip install 'drmas[{cfg.pipeline.launcher}]'", file=sys.stderr)
        return 2
    return launcher(cfg, out).run()
