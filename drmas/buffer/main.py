"""`drmas-buffer --config FILE [overrides]`: the trajectory buffer as a process of its own.

Why its own process rather than a thread inside a learner: with one learner per model, no learner is the
natural host, and a learner restart (crash, resume) would take every queued group and every producer's
connection down with it. On its own, the buffer outlives learner restarts, and its accounting (received,
delivered, dropped by reason, held) covers the whole run in one place.

It also owns the `buffer/*` metrics: every `pipeline.report_interval_s` one record of its counters goes to
`<output_dir>/buffer/` (metrics.jsonl and TensorBoard), and a last one on the way out; and the journal of the
drawing order, `<output_dir>/buffer/draws.jsonl`: one line per grant (the draws handed out, which of them
again), per draw sent back to be drawn again (and why) and per draw given up, appended line by line so that a
`kill -9` loses none (restarted buffers append to it; each line names the buffer instance).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from drmas.runtime.launcher_watch import watch_launcher
from drmas.runtime.process import StopFlag, add_log_file, config_parser, load_or_exit, setup_logging

log = logging.getLogger("drmas.buffer")


def buffer_scalars(stats, agents: list[str]) -> dict[str, float]:
    """The buffer's counters under their TensorBoard names. Sample counts satisfy
    ``buffer/received_samples == buffer/delivered_samples + sum(buffer/dropped/*) + buffer/held_samples``."""
    out = {f"buffer/{agent}/depth": float(stats.depth.get(agent, 0)) for agent in agents}
    out.update({f"buffer/dropped/{reason}": float(n) for reason, n in stats.dropped.items()})
    out.update({f"buffer/rejected/{reason}": float(n) for reason, n in stats.rejected.items()})
    out.update({f"buffer/learner_dropped/{reason}": float(n) for reason, n in stats.reported_drops.items()})
    out.update({f"buffer/version/{model}": float(v) for model, v in stats.model_versions.items()})
    out.update({f"buffer/draws/{name}": float(n) for name, n in stats.draws.items()})
    out.update({
        "buffer/received_samples": float(stats.received_samples),
        "buffer/delivered_samples": float(stats.delivered_samples),
        "buffer/held_samples": float(stats.samples_in_buffer),
        "buffer/incomplete_groups": float(stats.incomplete_groups),
        "buffer/running_groups": float(stats.running_groups),
        "buffer/parked_acks": float(stats.parked_acks),
    })
    return out


class DrawJournal:
    """`buffer/draws.jsonl`: the drawing order's events (`drmas.buffer.draws.DrawLedger`), a line each, written
    as they happen (under the buffer's lock; a grant is a few per training step)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = None
        self._instance = ""

    def earlier(self) -> tuple[int, list[int]]:
        """What earlier buffers of this run journalled: one past the highest draw they handed out (0 for none),
        and the draws they gave up. A torn line (a kill mid-write) is skipped. The launcher claims the output
        directory (`drmas.runtime.run_dir`), so the journal found there is this run's."""
        top, given_up = 0, []
        if self.path.is_file():
            for line in self.path.read_text(errors="replace").splitlines():
                try:
                    event = json.loads(line)
                    draws = [int(d) for d in event.get("draws", ()) if int(d) >= 0]
                except (ValueError, TypeError, AttributeError):
                    continue
                if event.get("event") == "issue":
                    top = max([top, *(d + 1 for d in draws)])
                elif event.get("event") == "give_up":
                    given_up += draws
        return top, given_up

    def open(self, instance: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("a", buffering=1)
        self._instance = instance

    def __call__(self, event: dict) -> None:
        if self._handle is not None:
            self._handle.write(json.dumps({"time": round(time.time(), 3), "buffer": self._instance, **event}) + "\n")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def main(argv: list[str] | None = None) -> int:
    parser = config_parser("drmas-buffer", "Serve the trajectory buffer between rollouts and learners.")
    args = parser.parse_args(argv)
    cfg = load_or_exit("drmas-buffer", args.config, args.overrides)
    setup_logging("buffer")
    stop = StopFlag()
    watch_launcher(stop)
    from drmas.buffer.server import TrajectoryBuffer
    from drmas.config.derived import trained_agent_models
    import zmq

    from drmas.runtime.endpoints import EndpointError, listen_error, require_fixed
    from drmas.runtime.metrics import MetricsWriter

    agent_models = trained_agent_models(cfg)
    out = Path(cfg.trainer.output_dir) / "buffer"
    journal = DrawJournal(out / "draws.jsonl")
    drawn_before, given_up_before = journal.earlier()
    try:
        require_fixed(cfg, buffer=True)
        buffer = TrajectoryBuffer(
            cfg.pipeline.buffer, agent_models=agent_models,
            groups_per_step={m: cfg.rollout.prompts_per_step for m in set(agent_models.values())},
            max_staleness=cfg.pipeline.max_staleness, journal=journal, drawn_before=drawn_before,
            given_up_before=given_up_before,
        )
    except (EndpointError, ValueError) as exc:
        print(f"drmas-buffer: {exc}", file=sys.stderr)
        return 2
    except zmq.ZMQError as exc:  # a port in use: not the config's fault for good (a launcher may retry), so 1
        print(f"drmas-buffer: {listen_error(cfg, exc, buffer=True)}", file=sys.stderr)
        return 1
    add_log_file(out)
    journal.open(buffer.instance)
    writer = MetricsWriter(out, tensorboard=cfg.logging.tensorboard)
    buffer.start()
    log.info("serving producers at %s, learners at %s (max_staleness=%d)", buffer.producer_endpoint,
             buffer.consumer_endpoint, cfg.pipeline.max_staleness)
    agents = sorted(agent_models)
    records = 0
    try:
        while not stop.wait(cfg.pipeline.report_interval_s):
            records += 1
            writer.log(records, buffer_scalars(buffer.stats(), agents))
    finally:
        buffer.stop()
        stats = buffer.stats()
        writer.log(records + 1, buffer_scalars(stats, agents))
        writer.close()
        journal.close()
    log.info("stopped by %s: received %d samples, delivered %d, dropped %s, held %d", stop.signal_name or "request",
             stats.received_samples, stats.delivered_samples, stats.dropped, stats.samples_in_buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
