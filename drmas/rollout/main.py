"""`drmas-rollout --config FILE [--index I] [overrides]`: one rollout process of the async pipeline."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from drmas.assembly import load_or_exit
from drmas.runtime.launcher_watch import watch_launcher
from drmas.runtime.process import StopFlag, add_log_file, config_parser, setup_logging

log = logging.getLogger("drmas.rollout")


def main(argv: list[str] | None = None) -> int:
    parser = config_parser("drmas-rollout", "Generate episodes and stream them to the trajectory buffer.")
    parser.add_argument(
        "--index", "-i", type=int, default=0,
        help="this rollout's number; rollouts running at the same time need different ones (it names the "
        "process to the buffer and the learners, and its output directory rollout-<index>)",
    )
    args = parser.parse_args(argv)
    cfg = load_or_exit("drmas-rollout", args.config, args.overrides)
    setup_logging(f"rollout-{args.index}")
    add_log_file(Path(cfg.trainer.output_dir) / f"rollout-{args.index}")
    stop = StopFlag()
    watch_launcher(stop)
    from drmas import assembly
    from drmas.episodes.failures import EpisodeFailures
    from drmas.rollout.worker import RolloutWorker
    from drmas.runtime.endpoints import EndpointError, require_fixed

    try:
        require_fixed(cfg, buffer=True, learners=assembly.trained_models(cfg))
        worker = RolloutWorker(cfg, args.index, stop)
    except (EndpointError, FileNotFoundError, ValueError, ImportError) as exc:  # ImportError: an engine's package
        print(f"drmas-rollout: {exc}", file=sys.stderr)
        return 2
    try:
        worker.run()
    except EpisodeFailures as exc:  # a plugin fails every episode: stop (the launcher's restart policy applies)
        print(f"drmas-rollout: {exc}", file=sys.stderr)
        return 1
    log.info("stopped by %s after %d groups", stop.signal_name or "request", worker.groups_started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
