"""One trained model inside a learner process: its groups, update, version, push, statistics and checkpoints.

A learner process trains one model (one lane), or every adapter of one base model over one copy of the base
(one lane per adapter, `drmas.learner.worker`). Everything that makes a model id behave as a model of the
pipeline is a lane's own, so an adapter trained beside others behaves as one trained alone: its collector
(the buffer's parts of its agents, under its staleness bound), trainer and optimizer, version and lineage,
weight sender (its port, its rollouts), running reward statistics, the draws it trained, its output directory
(`<output_dir>/learner-<model id>/`: metrics, TensorBoard, checkpoints, prompts.jsonl) and resume.

Order within a step matters for the staleness bound. The new weights are pushed to every connected
rollout *before* the new version is reported to the buffer, because the buffer admits new groups on the
strength of that version: a rollout admitted for version v + 1 must already generate with it, or its
groups would arrive one version staler than admission assumed. The optimizer steps and the version bump
happen inside `WeightSender.exclusive()`, so a rollout that joins meanwhile is never sent half-updated
weights or new weights under the old version number. By default (`pipeline.weights.background`) the push
runs on a thread of its own (`drmas.learner.push`) while the lane pulls its next batch and runs its forward
and backward passes; the next optimizer step waits for it, and the version is reported once it is over.
A learner of several ranks, whose weights are gathered by collectives, pushes from its own thread.

A batch whose update fails (an exception in the advantages or the update, after the sample checks of
`GroupCollector`) costs that batch, not the learner: its groups are reported dropped ('update_failed'),
gradients and running statistics are rolled back, and the lane pulls the next batch. Only
`MAX_FAILED_UPDATES` failures in a row end the process (then something is wrong with the learner itself,
and a supervisor restarting it with resume is the better remedy). A learner of N ranks cannot skip a
batch: its other ranks are inside the failed update's collectives. It ends at once (`LearnerRanksFailed`),
naming the rank that failed and why (`drmas.learner.ranks.group`); resume continues from the last checkpoint.

The draws it trains (`drmas.core.draws`: each group's place in the run's drawing order) are its record of
which prompts its weights have seen: kept per agent, saved in every checkpoint, reported to the buffer with
every version (the buffer draws again whatever was handed out and is neither trained nor on its way, see
`drmas.buffer.draws`), and written per step to `prompts.jsonl` (`{"step", "draws", "prompts", "agents"}`: the
draws, their problems' uids, and the draws each agent trained). Its checkpoints also keep the order's
fingerprint: a resume under another `trainer.seed` or training split is refused before any model is built.
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from drmas import assembly
from drmas.algorithms.running_stats import AgentRewardStats
from drmas.buffer import BufferConsumer
from drmas.config.load import to_yaml
from drmas.config.schema import DrmasConfig
from drmas.core.draws import DrawSet
from drmas.core.lineage import Lineage
from drmas.learner.batch import GroupCollector, StepBatch, group_advantages, report_drops
from drmas.learner.policy import PolicyTrainer, UpdateStopped
from drmas.learner.push import BackgroundPush, PushFailed, SharedConsumer
from drmas.learner.ranks.group import BatchFanout, failure_reports
from drmas.learner.sample_limits import SampleLimits
from drmas.learner.scalars import agent_reward_stats, agent_scalars, reward_stats_scalars, staleness_scalars
from drmas.models import checkpoint
from drmas.runtime.endpoints import learner_address
from drmas.runtime.metrics import PROMPTS_FILE, MetricsWriter, StepRecords, agent_line, reward_stats_line
from drmas.runtime.netsec import server_keys
from drmas.runtime.process import StopFlag
from drmas.weights import WeightSender

log = logging.getLogger(__name__)

MAX_FAILED_UPDATES = 3  # failed updates in a row after which the learner gives up
PUSH_POLL_MS = 10  # a pull's longest wait while a push is in flight: its version is reported soon after it ends
DROP_UPDATE_FAILED = "update_failed"


def precision(trainer: PolicyTrainer) -> str:
    """How the learner computes, in words (the log line users check first on a GPU)."""
    weights = str(next(trainer.model.parameters()).dtype).removeprefix("torch.")
    compute = str(trainer.compute_dtype).removeprefix("torch.")
    if trainer.adapter is not None:
        adapter = str(trainer.params[0].dtype).removeprefix("torch.")
        return f"{adapter} adapter {trainer.adapter!r} over a frozen {weights} base"
    return f"{weights} weights" if compute == weights else f"{weights} weights, {compute} autocast"


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (all of a learner's lanes together)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6  # bytes on macOS, KiB on Linux


class UpdateFailed(RuntimeError):
    """An update raised before changing the weights: the batch is dropped, the learner goes on."""


class LearnerRanksFailed(RuntimeError):
    """An update or weight gather of a learner of N ranks failed: the learner ends (it cannot skip it)."""


class ModelLane:
    """The training of one model id in a learner process (its directory claimed by the process): `open()`,
    then batches from `next_batch` / `poll` go to `train`; `finish()` and `close()` at the end."""

    def __init__(self, cfg: DrmasConfig, model_id: str, trainer: PolicyTrainer, tokenizer, fanout: BatchFanout,
                 stop: StopFlag, order: str, device) -> None:
        self.cfg, self.model_id, self.stop = cfg, model_id, stop
        self.trainer, self.tokenizer, self.model = trainer, tokenizer, trainer.model
        self.fanout = fanout  # the other ranks' batches (none with one rank)
        self.order = order  # the drawing order's fingerprint: saved with the draws trained
        self.device = device  # the learner rank's device
        self.out = Path(cfg.trainer.output_dir) / f"learner-{model_id}"
        self.agents = assembly.trained_agents(cfg, model_id)
        # what pushes, join syncs and HF checkpoints read: the live parameters, or (sharded) a gather streamed
        # one parameter at a time, each pass ordered to the other ranks; never a whole copy of the model
        self.source = trainer.weight_source(before_pass=fanout.gather)
        self.stats = AgentRewardStats(window=cfg.algorithm.running_stats_window)
        self.version = 0
        self.saved_version = 0
        self.trained = {agent: DrawSet() for agent in self.agents}  # the draws trained, per agent
        self.lineage = Lineage()  # which (incarnation, version) stamps name weights of this learner's history
        self.consumer = SharedConsumer(BufferConsumer.from_config(cfg.pipeline.buffer))
        host, port = learner_address(cfg, model_id)
        self.sender = WeightSender.from_config(cfg.pipeline.weights, host, port, model=model_id,
                                               incarnation=self.lineage.incarnation,
                                               current_weights=self._current_weights,
                                               curve=server_keys(cfg.pipeline.buffer), device=device,
                                               dtype=trainer.push_dtype, joins_in_thread=self.source.concurrent)
        self.limits = SampleLimits.of_model(self.model, cfg.pipeline.buffer.max_sample_tokens)
        self.collector = GroupCollector(self.consumer, self.agents, cfg.rollout.prompts_per_step,
                                        cfg.pipeline.max_staleness, stop, limits=self.limits,
                                        idle=self.while_waiting,
                                        trained=lambda part: part.draw in self.trained[part.agent],
                                        makeup=lambda part: any(part.draw in self.trained[agent]
                                                                for agent in self.agents if agent != part.agent))
        # a push on its own thread: not where a gather is a collective of the ranks (it must be on this thread)
        self.background = cfg.pipeline.weights.background and self.source.concurrent
        self._push: BackgroundPush | None = None  # the push in flight
        self._pushed = None  # the report of the last push that ended
        self._push_wait_s = 0.0  # how long this thread waited for the last step's push
        self._unlogged: tuple | None = None  # (version, scalars, histograms, end) of a step whose push is in flight
        self.closing = False
        self.failed_updates = 0
        self.failed_in_a_row = 0
        self.finished = False  # the buffer was told this lane reached its steps
        self.writer: MetricsWriter | None = None
        self.prompts: StepRecords | None = None
        self._last = time.monotonic()

    @property
    def done(self) -> bool:
        """Whether this lane reached `trainer.steps` versions."""
        return self.version >= self.cfg.trainer.steps

    def open(self) -> None:
        """Resume (with trainer.resume), open the metrics, start serving weights, report the version."""
        cfg = self.cfg
        if cfg.trainer.resume:
            self._resume()
        (self.out / "config.yaml").write_text(to_yaml(cfg))
        # a resumed learner logs the versions after its checkpoint again: never twice (see MetricsWriter)
        resumed_at = self.version if cfg.trainer.resume else None
        self.writer = MetricsWriter(self.out, tensorboard=cfg.logging.tensorboard, resumed_at=resumed_at)
        self.prompts = StepRecords(self.out / PROMPTS_FILE, resumed_at=resumed_at)
        self.sender.start()
        log.info("learner of %r (agents %s) at version %d on %s (%s); rollouts join %s (%s)", self.model_id,
                 self.agents, self.version, self.device, precision(self.trainer), self.sender.endpoint,
                 self.sender.backend)
        self.report_version()
        self._last = time.monotonic()

    def _current_weights(self):
        """What a rollout that just joined receives (under `exclusive()`; on the sender's join-sync thread, or
        with a gathered source on this thread in `serve_joins`)."""
        return self.version, self.source

    def while_waiting(self) -> None:
        """Before every pull: keep the other ranks' wait for orders alive, serve joins, collect a push that
        ended."""
        self.collective("keepalive", self.fanout.keepalive)
        self.serve_joins()
        if self._push is not None and self._push.done():
            self.settle_push()

    def settle_push(self) -> None:
        """Wait for the push in flight, if any (its thread reported its version); then write its step's metrics."""
        if self._push is None:
            return
        push, self._push = self._push, None
        self._pushed, waited = push.wait()
        self._push_wait_s += waited
        self._log_step()

    def _push_and_report(self, version: int):
        """The push thread: the weights of `version` to the rollouts, then the version to the buffer. This
        lane's thread changes neither the weights nor the version and draws reported until it joined."""
        report = self.sender.push(self.source, version)
        self.report_version()
        return report

    def serve_joins(self) -> None:
        """Join syncs the sender leaves to this thread (a sharded source's gather is a collective that must
        not interleave with the update's); called between steps and while waiting for a batch."""
        self.collective("join sync", self.sender.serve_joins)

    def next_batch(self) -> StepBatch | None:
        """The next update's batch, waiting for it; None once stopped. While a push is in flight the pulls are
        short: its thread reports the version over the same connection the moment it ends (admission may be
        waiting for it)."""
        while self._push is not None and not self.stop.is_set():
            batch = self.collector.poll(self.version, self.lineage, PUSH_POLL_MS)
            if batch is not None:
                return batch
        return self.collector.next_batch(self.version, self.lineage)

    def poll(self, wait_ms: int) -> StepBatch | None:
        """The next update's batch if it is whole after one pull of at most `wait_ms`, else None."""
        return self.collector.poll(self.version, self.lineage,
                                   wait_ms if self._push is None else min(wait_ms, PUSH_POLL_MS))

    def train(self, batch: StepBatch) -> bool:
        """One update on `batch` and everything after it (metrics, prompts.jsonl, checkpoint); False when the
        update failed and the batch was dropped. Raises `UpdateStopped` (the update abandoned) and, after
        `MAX_FAILED_UPDATES` failures in a row, RuntimeError."""
        try:
            scalars, hists = self._step(batch)
        except UpdateFailed as exc:
            self.failed_in_a_row += 1
            self._drop_failed(batch, exc)
            return False
        self.failed_in_a_row = 0
        now = time.monotonic()
        scalars.update(self._timing(batch, now - self._last))
        self._last = now
        self._unlogged = (self.version, scalars, hists, time.time())
        if self._push is None:  # pushed from this thread: the step's metrics are whole
            self._log_step()
        self.prompts.write({"step": self.version, **batch.prompts_record()})
        cfg = self.cfg
        if cfg.logging.console_every and self.version % cfg.logging.console_every == 0:
            log.info(agent_line(self.version, scalars, self.agents, [self.model_id]))
        if cfg.trainer.checkpoint_interval and self.version % cfg.trainer.checkpoint_interval == 0:
            self.settle_push()  # a step's metrics are written before its checkpoint (a resume never skips one)
            self.save()
        return True

    def _log_step(self) -> None:
        """Write the last step's metrics, with the figures of its push (in the background: once it ended)."""
        if self._unlogged is None:
            return
        version, scalars, hists, ended = self._unlogged
        self._unlogged = None
        scalars.update(self._push_scalars())
        self.writer.log(version, scalars, hists, at=ended)  # stamped with the step's end: throughput is measured

    def finish(self) -> None:
        """The lane ends normally: its version saved; the buffer told it finished when it reached its steps, so
        admission stops waiting for it (a peer learner that restarted behind it still gets groups)."""
        self.settle_push()
        if self.version != self.saved_version:
            self.save()  # with N ranks a collective: before the other ranks are let go
        if self.done and not self.stop.is_set() and not self.finished:
            self.report_version(finished=True)
            self.finished = True

    def close(self) -> None:
        """Release everything; an unsaved version is saved (one rank) or named as lost (N ranks)."""
        self.closing = True  # a push still reporting its version gives up retrying (the buffer may be gone)
        try:
            self.settle_push()
        except PushFailed:
            log.exception("the last push of %r failed", self.model_id)
        if self.version != self.saved_version:
            if self.trainer.ranks.size == 1:
                self.save()
            else:  # an exception: the other ranks cannot be relied on to write their shards
                log.error("version %d of %r is not saved (the learner ranks failed); the last checkpoint is "
                          "version %d", self.version, self.model_id, self.saved_version)
        for closable in (self.writer, self.prompts):
            if closable is not None:
                closable.close()
        log.info("running reward statistics of %r at version %d: %s", self.model_id, self.version,
                 reward_stats_line(agent_reward_stats(self.stats)))
        self.sender.close()
        self.consumer.close()

    def _step(self, batch: StepBatch) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """One update on `batch`, then the new weights out to the rollouts and the new version to the buffer.

        Raises `UpdateFailed` when computing the advantages or the update raised: weights, version and
        running statistics are then as before the call."""
        m = self.model_id
        stats_before = self.stats.state_dict()
        try:
            samples, adv = group_advantages(batch.groups, self.cfg.algorithm, self.stats)
            scalars = agent_scalars(samples, adv)
            scalars.update(reward_stats_scalars(self.stats))
            stale, hists = staleness_scalars(samples, self.version)
            scalars.update(stale)
        except Exception as exc:
            self.stats.load_state_dict(stats_before)
            raise UpdateFailed(f"advantages: {exc!r}") from exc
        self.fanout.send(samples, adv)
        started = time.monotonic()
        with ExitStack() as weights:  # the transfer lock, from the first change of the weights to the push
            held: list[float] = []  # the seconds waited for the last push before the weights changed

            def change_weights() -> None:  # the push of the last version is over, and none starts
                if not held:
                    waiting = time.monotonic()
                    self.settle_push()
                    weights.enter_context(self.sender.exclusive())
                    held.append(time.monotonic() - waiting)

            if not self.background:
                change_weights()
            try:  # a stop signal abandons the update at its next safe point (one rank only, see `update`)
                scalars.update(self.trainer.update(samples, adv, version=self.version, should_stop=self.stop.is_set,
                                                   before_step=change_weights))
            except UpdateStopped:
                self.stats.load_state_dict(stats_before)
                raise
            except PushFailed:
                raise
            except Exception as exc:  # before optimizer.step: the weights are unchanged
                if self.trainer.ranks.size > 1:  # the other ranks are inside this update's collectives
                    raise self.ranks_failed("update", exc) from exc
                self.trainer.optimizer.zero_grad(set_to_none=True)
                self.stats.load_state_dict(stats_before)
                raise UpdateFailed(f"update: {exc!r}") from exc
            updated = time.monotonic() - sum(held)  # the wait for the last push is not the update's
            change_weights()  # every step skipped (a gradient not finite): the version moves all the same
            self.version += 1
            self._mark_trained(batch)
            if self.background:  # its thread takes the transfer lock once this block lets it go
                version = self.version
                self._push = BackgroundPush(lambda: self._push_and_report(version), version)
            else:
                self._pushed = self.collective("weight push", lambda: self.sender.push(self.source, self.version))
                self._push_wait_s += self._pushed.seconds
        if not self.background:
            self.report_version()
        scalars.update({
            f"version/{m}": float(self.version),
            f"time/{m}/update_seconds": updated - started,
            f"memory/{m}/peak_rss_mb": peak_rss_mb(),  # the whole process's: all its lanes together
            f"weight_sync/{m}/gathered_mb": self.source.peak_bytes / 1e6,  # N ranks: rank 0's extra, bounded
            f"samples/{m}": float(len(samples)),
            **{f"dropped/{m}/{reason}": float(n) for reason, n in batch.dropped.items()},
            f"failed_updates/{m}": float(self.failed_updates),
        })
        return scalars, hists

    def _push_scalars(self) -> dict[str, float]:
        """The figures of the push of the step being logged."""
        report, m = self._pushed, self.model_id
        waited, self._push_wait_s = self._push_wait_s, 0.0
        return {
            f"weight_sync/{m}/learner_wait_seconds": waited,  # this thread's (the whole push, unless in the background)
            f"weight_sync/{m}/seconds": report.seconds,
            f"weight_sync/{m}/mb": report.bytes / 1e6,  # per rollout, in the engines' dtype (the compute dtype)
            f"weight_sync/{m}/receivers": float(len(report.receivers_ok)),
            f"weight_sync/{m}/dropped": float(len(report.receivers_dropped)),
            f"weight_sync/{m}/learner_sends": float(report.learner_sends),  # passes over the model (1: flat)
        }

    def _mark_trained(self, batch: StepBatch) -> None:
        for part in batch.groups:
            if part.draw >= 0:
                self.trained[part.agent].add(part.draw)
                for agent in self.agents:  # those with no part in the group had nothing to train in it
                    if part.group_agents and agent not in part.group_agents:
                        self.trained[agent].add(part.draw)

    def collective(self, what: str, work):
        """``work()``; with N ranks its gathers are collectives: a failure ends the learner naming the rank."""
        try:
            return work()
        except Exception as exc:
            if self.trainer.ranks.size > 1:
                raise self.ranks_failed(what, exc) from exc
            raise

    def ranks_failed(self, what: str, exc: Exception) -> LearnerRanksFailed:
        """The error that ends a learner of N ranks whose `what` raised `exc` on rank 0: which rank failed
        and why (the others' reports, or rank 0's own exception), logged and returned."""
        size = self.trainer.ranks.size
        reports = failure_reports(size)
        causes = ([f"rank {rank} of {size}: {why}" for rank, why in sorted(reports.items())]
                  or [f"rank 0 of {size}: {type(exc).__name__}: {exc}"])
        message = (f"the {what} from version {self.version} failed on learner {'; '.join(causes)}. The learner "
                   f"ends (its ranks cannot skip a batch together); restart with trainer.resume=true to continue "
                   f"from its last checkpoint (version {self.saved_version})")
        log.error("%s", message, exc_info=exc if not reports else None)
        return LearnerRanksFailed(message)

    def _drop_failed(self, batch: StepBatch, exc: UpdateFailed) -> None:
        """Give up on a batch whose update failed: say why, report its groups dropped, go on (or stop)."""
        self.failed_updates += 1
        log.error("update of %r from version %d failed on %d samples (%d in a row): %s; dropping the batch",
                  self.model_id, self.version, len(batch.samples), self.failed_in_a_row, exc, exc_info=exc.__cause__)
        report_drops(self.consumer, batch.groups, DROP_UPDATE_FAILED)
        if self.failed_in_a_row >= MAX_FAILED_UPDATES:
            raise RuntimeError(f"{self.failed_in_a_row} updates of {self.model_id!r} in a row failed; the last: "
                               f"{exc}") from exc

    def _timing(self, batch: StepBatch, elapsed: float) -> dict[str, float]:
        elapsed = max(elapsed, 1e-9)
        return {
            f"throughput/{self.model_id}/samples_per_s": len(batch.samples) / elapsed,
            f"idle/{self.model_id}": min(batch.wait_s / elapsed, 1.0),
            f"time/{self.model_id}/step_seconds": elapsed,
        }

    def report_version(self, finished: bool = False) -> None:
        """Tell the buffer our version (admission and its stale-drop rule follow it); waits for the buffer."""
        while True:
            try:
                self.consumer.report_version(self.model_id, self.version, self.lineage.incarnation, finished,
                                             trained=self.trained)
                return
            except TimeoutError as exc:
                log.warning("%s; retrying", exc)
                if self.stop.is_set() or self.closing:
                    return

    # ---- checkpoints -------------------------------------------------------------------------------
    def save(self) -> Path:
        """Weights (HF directory), weights and optimizer (DCP, every rank its shards), running statistics and
        version, under `checkpoints/step_<version>`."""
        path = self.fanout.save(self.trainer, self.out, self.version, self.source, self.tokenizer,
                                {"version": self.version, "model": self.model_id, "stats": self.stats.state_dict(),
                                 "lineage": self.lineage.state_dict(), "ranks": self.trainer.ranks.size,
                                 "draws": {a: d.state_dict() for a, d in self.trained.items()},
                                 "order": self.order},
                                keep=self.cfg.trainer.keep_checkpoints)
        self.saved_version = self.version
        log.info("saved %s", path)
        return path

    def _resume(self) -> bool:
        log.info("%s", checkpoint.resume_line(self.out, unit="version"))
        ckpt = checkpoint.latest_checkpoint(self.out)
        if ckpt is None:
            return False
        state = checkpoint.load_run_state(ckpt)
        self.fanout.resume(self.trainer, ckpt, int(state["version"]))  # resharded onto our ranks
        self.version = self.saved_version = int(state["version"])
        self.stats.load_state_dict(state["stats"])
        self.lineage = self.lineage.resumed(state.get("lineage"), self.version)
        for agent, draws in state.get("draws", {}).items():  # a checkpoint older than draw numbers has none
            if agent in self.trained:
                self.trained[agent] = DrawSet.from_state(draws)
        log.info("resumed from %s at version %d, written by %s rank(s), on %d (%r, incarnation %s; kept from "
                 "earlier ones: %s)", ckpt, self.version, state.get("ranks", 1), self.trainer.ranks.size,
                 self.model_id, self.lineage.incarnation, self.lineage.ancestors)
        return True
