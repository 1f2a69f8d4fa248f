"""`drmas-learner --config FILE --model ID [overrides]`: the learner process of one trained model, or of the
adapters of one base model (`drmas.learner.worker`)."""

from __future__ import annotations

import logging
import os
import sys

from drmas.config import read_config
from drmas.config.derived import model_config
from drmas.learner.allocator import use_allocator
from drmas.learner.heap import advise_huge_pages
from drmas.runtime.launcher_watch import watch_launcher
from drmas.runtime.process import StopFlag, config_parser, die_with_torchrun, setup_logging

log = logging.getLogger("drmas.learner")


def main(argv: list[str] | None = None) -> int:
    die_with_torchrun()  # a rank of a sharded learner must not outlive its torchrun
    parser = config_parser("drmas-learner", "Train one model on the groups its agents produce (async pipeline).")
    parser.add_argument("--model", "-m", required=True,
                        help="id of the learner process: a trained model (a key of `models`), a model with adapters "
                             "(all its trained adapters, over one copy of the base), or one adapter <model>/<adapter>")
    args = parser.parse_args(argv)
    # before torch is imported: this may re-execute the process with jemalloc preloaded (drmas.learner.allocator)
    malloc_note = use_allocator(allocator_of(args.config, args.overrides, args.model))
    from drmas.assembly import load_or_exit

    cfg = load_or_exit("drmas-learner", args.config, args.overrides)
    setup_logging(f"learner-{args.model}")
    if malloc_note:
        log.warning(malloc_note)
    stop = StopFlag()
    from drmas.learner.worker import LearnerWorker, models_of
    import zmq

    from drmas.runtime.endpoints import EndpointError, listen_error, require_fixed

    try:
        model_ids = models_of(cfg, args.model)
    except ValueError as exc:
        print(f"drmas-learner: --model: {exc}", file=sys.stderr)
        return 2
    # before any tensor is allocated: PyTorch's allocator reads the setting once (drmas.learner.heap)
    advise_huge_pages(model_config(cfg, model_ids[0]).huge_pages)
    if int(os.environ.get("RANK", "0")) > 0:  # a further rank of a sharded learner (torchrun): follows rank 0
        return follow_rank_0(cfg, args.model)
    watch_launcher(stop)  # rank 0 only: the other ranks end with torchrun, which ends with rank 0
    try:
        require_fixed(cfg, buffer=True, learners=model_ids)
        worker = LearnerWorker(cfg, args.model, stop)
    except (EndpointError, FileNotFoundError, ValueError) as exc:
        print(f"drmas-learner: {exc}", file=sys.stderr)
        return 2
    try:
        version = worker.run()
    except zmq.ZMQError as exc:  # its weight-sync port in use: one line, and a launcher may retry (exit 1)
        print(f"drmas-learner: {listen_error(cfg, exc, learners=model_ids)}", file=sys.stderr)
        return 1
    if stop.is_set():
        log.info("stopped by %s at version %d", stop.signal_name or "request", version)
    else:
        log.info("done: version %d", version)
    return 0


def allocator_of(config: str | None, overrides: list[str], model: str) -> str:
    """`models.<id>.allocator` of this learner's model, read without plugins or torch; glibc where the config
    does not read (the full load that follows reports why)."""
    try:
        return model_config(read_config(config, overrides), model).allocator
    except Exception:  # noqa: BLE001 - any config error is load_or_exit's to report
        return "glibc"


def follow_rank_0(cfg, model_id: str) -> int:
    """Ranks 1..N-1 of a model's learner: same model and trainer as rank 0, batches from it (see
    `drmas.learner.ranks.group`); they stop when rank 0 does (a signal is rank 0's to handle)."""
    from drmas.learner.ranks.group import BatchFanout, follow, learner_ranks
    from drmas.learner.trainers import trained_policy

    mcfg = model_config(cfg, model_id)
    try:
        ranks, device = learner_ranks(mcfg.device, mcfg.ranks, model_id, mcfg.collective_timeout_s)
    except ValueError as exc:
        print(f"drmas-learner: {exc}", file=sys.stderr)
        return 2
    if cfg.trainer.threads > 0:
        import torch

        torch.set_num_threads(cfg.trainer.threads)
    trainer, _ = trained_policy(cfg, model_id, ranks, device)
    follow(trainer, BatchFanout(ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
