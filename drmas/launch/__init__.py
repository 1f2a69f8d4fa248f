"""`drmas run` with `pipeline.mode=async`: start the pipeline's processes with the launcher the config names.

`pipeline.launcher` picks one of `LAUNCHERS`: `local` (OS processes of this machine, `drmas.launch.local`) or
`ray` (Ray actors placed on a cluster, `drmas.launch.ray_launcher`). Both share the run around the processes
(`drmas.launch.supervisor`). A launcher is a factory `(cfg, out) -> object with run() -> exit code`; the
built-ins import their module only when chosen, so Ray stays an optional extra.
"""

from __future__ import annotations

import sys
from typing import Callable, TextIO

from drmas.config.schema import DrmasConfig
from drmas.core.registry import Registry

LAUNCHERS: Registry[Callable[[DrmasConfig, TextIO], object]] = Registry("launcher")


@LAUNCHERS.register("local")
def _local(cfg: DrmasConfig, out: TextIO):
    from drmas.launch.local import LocalLauncher

    return LocalLauncher(cfg, out)


@LAUNCHERS.register("ray")
def _ray(cfg: DrmasConfig, out: TextIO):
    try:
        from drmas.launch.ray_launcher import RayLauncher
    except ImportError as exc:
        raise ImportError(f"pipeline.launcher=ray needs a package that is not installed ({exc}); "
                          "pip install 'drmas[ray]' (or `make ray`)") from exc
    return RayLauncher(cfg, out)


def launch(cfg: DrmasConfig, out: TextIO = sys.stdout) -> int:
    try:
        launcher = LAUNCHERS.lookup(cfg.pipeline.launcher, "pipeline.launcher")(cfg, out)
    except (ImportError, ValueError) as exc:
        print(f"drmas: {exc}", file=sys.stderr)
        return 2
    return launcher.run()
