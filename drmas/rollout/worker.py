"""The rollout loop: keep episodes generating, stream each one to the buffer, take new weights between rounds.

One `EpisodeRunner.stream` runs for the life of the process. Before every engine step it

* applies whatever weights the learners announced (`WeightReceiver.poll` in this thread), but only into an
  engine with no request in progress, so no response mixes versions: while requests run on it (vLLM's
  continuous batching), the engine is held (nothing new submitted) until they finish, then loaded and
  released. Live episodes simply continue with the new weights; their later turns carry the new version.
  Where the loop cannot wait (blocked on buffer credit, see below) the running requests are aborted instead
  and submitted again after the load;
* tops the live GRPO groups up to `groups_in_flight` (by default: enough to fill every engine's batch),
  but only as many as the buffer grants: the grant follows every model's staleness bound, so a group that
  would be too stale by the time a learner could train it is never started.

A finished episode goes to the buffer at once with the samples of trained agents only (nothing else would
ever leave the buffer) and the rewards of the other calls (frozen agents), which still count in the episode's
trajectory score and its group's pooled rewards, as they do in the colocated loop. While the buffer withholds
credit the loop keeps taking weight pushes (aborting running requests if it must), so a full buffer never
stalls a learner's push.

Before the first group, the loop waits for the current weights of every trained model from its learner, so
no sample is generated from weights that no learner vouches for (this also makes a rollout that joins late
start on the current version).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from pathlib import Path

import torch

from drmas import assembly
from drmas.buffer import BufferProducer
from drmas.config.schema import DrmasConfig
from drmas.rollout.episodes import EpisodeRequest, EpisodeResult, EpisodeRunner
from drmas.runtime.endpoints import learner_endpoint
from drmas.runtime.metrics import MetricsWriter
from drmas.runtime.netsec import client_keys
from drmas.runtime.process import StopFlag
from drmas.tasks.sampler import ProblemSampler
from drmas.weights import WeightReceiver
from drmas.weights.rollout.member import receiving_workers

log = logging.getLogger(__name__)

_IDLE_SLICE_S = 0.05  # how long one wait for admission or buffer credit lasts before weights are polled again
_PROBE_AFTER_S = 2.0  # silence of the buffer (while waiting for credit) after which the rollout checks it is alive


class _Stopped(Exception):
    """Raised inside the stream's callbacks to leave it at once when the process is asked to stop."""


class _Meter:
    """What happened since the last metrics record."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.start = time.monotonic()
        self.tokens = 0
        self.episodes = 0
        self.idle_s = 0.0
        self.apply_s: Counter[str] = Counter()


def groups_in_flight(cfg: DrmasConfig, models: int) -> int:
    """`pipeline.groups_in_flight`, or by default the groups that fill every served engine's batch: episodes
    wait on one model at a time, so `models` engines of `max_batch_size` rows need that many times the
    episodes (on a GPU a decode step costs about the same for any number of rows: an engine half full
    makes half the tokens)."""
    if cfg.pipeline.groups_in_flight:
        return cfg.pipeline.groups_in_flight
    full = -(-models * cfg.rollout.max_batch_size // cfg.rollout.group_size)
    return max(cfg.rollout.prompts_per_step, full)


class RolloutWorker:
    def __init__(self, cfg: DrmasConfig, index: int, stop: StopFlag) -> None:
        self.cfg, self.stop = cfg, stop
        self.name = f"rollout-{index}"
        self.incarnation = uuid.uuid4().hex[:8]  # group ids never repeat across restarts of this rollout
        if cfg.trainer.threads > 0:
            torch.set_num_threads(cfg.trainer.threads)
        task = assembly.build_task(cfg)
        self.sampler = ProblemSampler(task.split("train"), seed=cfg.trainer.seed * 1000 + index)
        served = sorted({a.model for a in cfg.agents.values() if a.model})  # none: a scripted agent
        self.engines = {m: assembly.build_engine(cfg, m, assembly.model_path(cfg, m), cfg.trainer.seed + index)
                        for m in served}
        self.trained_agents = assembly.trained_agent_models(cfg)
        self.receivers = {
            m: WeightReceiver.from_config(cfg.pipeline.weights, learner_endpoint(cfg, m), self.name,
                                          self.engines[m].load_weights, model=m,
                                          curve=client_keys(cfg.pipeline.buffer),
                                          workers=receiving_workers(self.engines[m]))
            for m in assembly.trained_models(cfg)
        }
        # the buffer keys leases and unfinished groups by producer: a restarted rollout of the same index must
        # not inherit (and keep alive with its heartbeats) what its dead predecessor held
        self.producer = BufferProducer.from_config(cfg.pipeline.buffer, f"{self.name}-{self.incarnation}")
        self.runner = EpisodeRunner(assembly.build_orchestra(cfg, task), self.engines, assembly.agent_specs(cfg),
                                    cfg.algorithm.invalid_penalty, seed=cfg.trainer.seed, on_round=self._between_rounds)
        self.group_size = cfg.rollout.group_size
        self.target_groups = groups_in_flight(cfg, len(served))
        self.open_groups: dict[str, int] = {}  # group id -> episodes not finished yet
        self.groups_started = 0
        self.rejected: Counter[str] = Counter()
        self._next_admission = 0.0
        self.meter = _Meter()
        self.writer = MetricsWriter(Path(cfg.trainer.output_dir) / self.name, tensorboard=cfg.logging.tensorboard)
        self.reports = 0

    # ---- lifecycle ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Generate until stopped; then leave the learners and close the buffer connection."""
        for receiver in self.receivers.values():
            receiver.start()
        try:
            self._wait_for_weights()
            self.meter.reset()
            self.runner.stream(self._admit, self._publish)
        except _Stopped:
            pass
        finally:
            self._report()
            self.writer.close()
            for receiver in self.receivers.values():
                receiver.close()
            self.producer.close()

    def _wait_for_weights(self) -> None:
        waiting_since = time.monotonic()
        while any(r.version is None for r in self.receivers.values()):
            self._poll_weights()
            if self.stop.wait(_IDLE_SLICE_S):
                raise _Stopped
            if time.monotonic() - waiting_since > 10:
                missing = [f"{m} at {r.endpoint}" for m, r in self.receivers.items() if r.version is None]
                log.info("waiting for the weights of %s", ", ".join(missing))
                waiting_since = time.monotonic()
        log.info("starting on versions %s", {m: r.version for m, r in self.receivers.items()})

    # ---- the stream's callbacks --------------------------------------------------------------------
    def _between_rounds(self) -> None:
        if self.stop.is_set():
            raise _Stopped
        self._poll_weights(can_wait=True)

    def _admit(self, live: int) -> list[EpisodeRequest]:
        """New episodes for the groups the buffer grants now; waits a slice when there is nothing to run."""
        if self.stop.is_set():
            raise _Stopped
        self._poll_weights(can_wait=True)
        if time.monotonic() - self.meter.start >= self.cfg.pipeline.report_interval_s:
            self._report()
        requests = self._admit_groups()
        if not requests and not live:
            start = time.monotonic()
            self.stop.wait(_IDLE_SLICE_S)
            self.meter.idle_s += time.monotonic() - start
        return requests

    def _admit_groups(self) -> list[EpisodeRequest]:
        wanted = self.target_groups - len(self.open_groups)
        if wanted <= 0 or time.monotonic() < self._next_admission:
            return []
        try:
            granted = self.producer.request_admission(wanted)
        except TimeoutError as exc:
            log.warning("%s; retrying", exc)
            granted = 0
        if granted < wanted:  # the bound (or the buffer) holds us back: ask again a little later, not every round
            self._next_admission = time.monotonic() + _IDLE_SLICE_S
        requests = []
        for problem in self.sampler.next(granted):
            group_id = f"{self.name}-{self.incarnation}-g{self.groups_started}"
            self.groups_started += 1
            self.open_groups[group_id] = self.group_size
            requests += [EpisodeRequest(f"{group_id}-e{i}", group_id, problem) for i in range(self.group_size)]
        return requests

    def _publish(self, result: EpisodeResult) -> None:
        """Send a finished episode (its trained agents' samples, the other calls' rewards) to the buffer, waiting
        for credit if needed. The other rewards keep its trajectory score that of the colocated loop."""
        group_id = result.request.group_id
        self.open_groups[group_id] -= 1
        if self.open_groups[group_id] == 0:
            del self.open_groups[group_id]
        self.meter.tokens += sum(len(s.response_ids) for s in result.samples)
        self.meter.episodes += 1
        samples = [s for s in result.samples if s.agent in self.trained_agents]
        frozen_rewards = [s.reward for s in result.samples if s.agent not in self.trained_agents]
        if not samples and not frozen_rewards:
            log.warning("episode %s made no agent call: its group cannot complete", result.request.episode_id)
            return
        start = time.monotonic()
        while self.producer.unacked >= self.producer.window:
            try:
                self.producer.flush(timeout_s=_IDLE_SLICE_S)
            except TimeoutError:
                if time.monotonic() - self.producer.last_reply_at > _PROBE_AFTER_S:
                    self.producer.probe(timeout_s=_PROBE_AFTER_S)  # a restarted buffer never acks: notice it
            if self.stop.is_set():
                raise _Stopped
            self._poll_weights()
        self.meter.idle_s += time.monotonic() - start
        self.producer.send_episode(group_id, self.group_size, result.request.episode_id, samples, frozen_rewards)
        for rejection in self.producer.pop_rejections():
            self.rejected[rejection.reason] += 1

    def _poll_weights(self, can_wait: bool = False) -> None:
        """Load announced weights into idle engines. An engine with requests in progress is held until they
        finish (`can_wait`: the stream goes on stepping), or else its requests are aborted, to be redone."""
        for model, receiver in self.receivers.items():
            receiver.run_engine_jobs()  # an engine whose workers receive builds or drops its pair ends here
            if not receiver.has_pending():
                self.runner.release(model)
                continue
            if self.runner.in_progress(model):
                if can_wait:
                    self.runner.hold(model)
                    continue
                self.runner.interrupt(model)
            if receiver.poll() is not None and receiver.last_apply_s is not None:
                self.meter.apply_s[model] += receiver.last_apply_s
            self.runner.release(model)

    # ---- metrics -----------------------------------------------------------------------------------
    def _report(self) -> None:
        meter = self.meter
        elapsed = max(time.monotonic() - meter.start, 1e-9)
        scalars = {
            "throughput/rollout/tokens_per_s": meter.tokens / elapsed,
            "throughput/rollout/episodes_per_s": meter.episodes / elapsed,
            "idle/rollout": min(meter.idle_s / elapsed, 1.0),
            "rollout/groups_in_flight": float(len(self.open_groups)),
            "rollout/groups_started": float(self.groups_started),
            **{f"rollout/rejected/{reason}": float(n) for reason, n in self.rejected.items()},
            "rollout/buffer_restarts": float(self.producer.buffer_restarts),
            "rollout/lost_episodes": float(self.producer.lost_episodes),
        }
        for model, engine in self.engines.items():
            scalars[f"version/{model}"] = float(engine.version)
        for model in self.receivers:
            scalars[f"weight_sync/{model}/pause_seconds"] = meter.apply_s[model]
        self.reports += 1
        self.writer.log(self.reports, scalars)
        meter.reset()
