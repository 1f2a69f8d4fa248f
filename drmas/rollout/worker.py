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
  would be too stale by the time a learner could train it is never started. A grant is a list of draw
  numbers: each group is the group of one draw of the run's drawing order (`ProblemSampler.at`, the same
  order in every rollout and in the colocated loop), and its episodes carry that number to the learner.
  When the buffer restarts, the groups of the dead buffer's grants are abandoned (the new one hands their
  draws out again; it would refuse their episodes). While an engine holds weights newer than its learner
  reports (a learner resumed from an older checkpoint and not re-joined yet), granted draws are held back
  rather than generated on weights whose samples would be dropped as orphaned.

A finished episode goes to the buffer at once with the samples of trained agents only (nothing else would
ever leave the buffer) and the rewards of the other calls (frozen agents), which still count in the episode's
trajectory score and its group's pooled rewards, as they do in the colocated loop. An episode that was dropped
(an external program never reported it, a plugin raised, it ran past its bounds) abandons its group: the buffer
drops what arrived of it and returns its admission slot and its draw (drawn again) at once, and its other episodes
are not sent. While the buffer withholds credit the loop keeps taking weight pushes (aborting running requests if
it must), so a full buffer never stalls a learner's push.

With `eval.interval`, rollout 0 also evaluates the newest weights beside its training groups
(`drmas.evaluation.interval`): the evaluation's episodes share the stream and the engines, take weight pushes
like every episode, and their results go to evals.jsonl, never to the buffer.

Before the first group, the loop waits for the current weights of every trained model from its learner, so
no sample is generated from weights that no learner vouches for (this also makes a rollout that joins late
start on the current version).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from drmas import assembly
from drmas.buffer import BufferProducer
from drmas.config.schema import DrmasConfig
from drmas.episodes import EpisodeRequest, EpisodeResult, EpisodeTally
from drmas.evaluation.interval import StreamEvaluations
from drmas.runtime.endpoints import learner_endpoint
from drmas.runtime.metrics import MetricsWriter
from drmas.runtime.netsec import client_keys
from drmas.runtime.process import StopFlag
from drmas.weights import WeightReceiver
from drmas.weights.rollout.member import receiving_workers

log = logging.getLogger(__name__)

_IDLE_SLICE_S = 0.05  # how long one wait for admission or buffer credit lasts before weights are polled again
_PROBE_AFTER_S = 2.0  # silence of the buffer (while waiting for credit) after which the rollout checks it is alive


@dataclass
class _OpenGroup:
    remaining: int  # episodes not finished yet
    draw: int
    prompt: str  # the problem's uid


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
        self.outcomes = EpisodeTally()  # episode/reward_mean, episode/info/<key>


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
        self.sampler = assembly.drawing_order(cfg, task)  # the run's one drawing order
        # one engine per model the agents use (a model with adapters: one engine serving all of them)
        self.engines = assembly.build_engines(cfg, cfg.trainer.seed + index)
        self.trained_agents = assembly.trained_agent_models(cfg)
        # what each trained model's pushes load into: its engine, or its adapter of its base's engine
        self.targets = {m: assembly.weight_target(self.engines, m) for m in assembly.trained_models(cfg)}
        self.receivers = {
            m: WeightReceiver.from_config(cfg.pipeline.weights, learner_endpoint(cfg, m), self.name,
                                          target.load_weights, model=m, curve=client_keys(cfg.pipeline.buffer),
                                          workers=receiving_workers(target))
            for m, target in self.targets.items()
        }
        # the buffer keys leases and unfinished groups by producer: a restarted rollout of the same index must
        # not inherit (and keep alive with its heartbeats) what its dead predecessor held
        self.producer = BufferProducer.from_config(cfg.pipeline.buffer, f"{self.name}-{self.incarnation}")
        self.orchestra = assembly.build_orchestra(cfg, task)
        self.runner = assembly.episode_runner(cfg, self.orchestra, self.engines, assembly.agent_specs(cfg),
                                              on_round=self._between_rounds)
        self.group_size = cfg.rollout.group_size
        self.target_groups = groups_in_flight(cfg, len(self.engines))
        self.samples_made = 0  # every sample generated, evaluation episodes' included
        self.evaluations = (StreamEvaluations(cfg, task, self.orchestra.agents, self.target_groups)
                            if cfg.eval.interval and index == 0 else None)
        self.open_groups: dict[str, _OpenGroup] = {}
        self.abandoned: set[str] = set()  # open groups not to send (a dropped episode; a buffer that restarted)
        self.abandoned_groups = 0
        self.dropped_episodes = 0
        self._buffer_restarts = 0
        self._deferred: list[int] = []  # granted draws held back (see `_ahead_of_learners`)
        self._holding = False
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
            assembly.close_orchestra(self.orchestra)
            self._report()
            self.writer.close()
            if self.evaluations is not None:
                self.evaluations.close()
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
        requests = self._admit_evaluation() + self._admit_groups()
        if not requests and not live:
            start = time.monotonic()
            self.stop.wait(_IDLE_SLICE_S)
            self.meter.idle_s += time.monotonic() - start
        return requests

    def _admit_evaluation(self) -> list[EpisodeRequest]:
        """eval.interval: an evaluation's episodes, into the group slots free now (the buffer grants none:
        they never go there)."""
        if self.evaluations is None or not self.receivers:
            return []
        version = min(self.targets[m].version for m in self.receivers)
        free = self.target_groups - len(self.open_groups) - self.evaluations.slots
        return self.evaluations.admit(version, free)

    def _admit_groups(self) -> list[EpisodeRequest]:
        wanted = self.target_groups - len(self.open_groups) - (self.evaluations.slots if self.evaluations else 0)
        if wanted <= 0 or time.monotonic() < self._next_admission:
            return []
        try:
            fresh = self.producer.request_admission(max(0, wanted - len(self._deferred)))  # eval slots may shrink wanted
        except TimeoutError as exc:
            log.warning("%s; retrying", exc)
            fresh = []
        self._check_buffer_restart()  # before starting groups of the new buffer's grant
        draws, self._deferred = self._deferred + fresh, []
        if draws and self._ahead_of_learners():
            self._deferred = draws  # weights of a lost branch: wait for the resumed learner's
        if len(draws) < wanted or self._deferred:  # held back: ask again a little later, not every round
            self._next_admission = time.monotonic() + _IDLE_SLICE_S
        if self._deferred:
            return []
        requests = []
        for draw in draws:
            problem = self.sampler.at(draw)
            group_id = f"{self.name}-{self.incarnation}-g{self.groups_started}"
            self.groups_started += 1
            self.open_groups[group_id] = _OpenGroup(self.group_size, draw, problem.uid)
            requests += [EpisodeRequest(f"{group_id}-e{i}", group_id, problem) for i in range(self.group_size)]
        return requests

    def _ahead_of_learners(self) -> bool:
        """Whether an engine holds weights newer than its learner reported to the buffer: those of a learner
        killed past its last checkpoint (the resumed one reported an older version and has not re-joined
        yet), or of a push whose report is on its way. Groups started on them now would be dropped as
        orphaned or become stale, so the grant waits (its draws kept) until the weights catch up. A version
        0 says nothing (a learner this buffer has not heard from may have finished and gone): never held."""
        versions = self.producer.learner_versions  # 0: not reported (yet) to this buffer, or nothing trained
        ahead = {m: (e.version, versions[m]) for m, e in self.engines.items() if 0 < versions.get(m, 0) < e.version}
        if ahead and not self._holding:
            log.info("holding granted draws: engine weights ahead of their learners' reported versions %s", ahead)
        self._holding = bool(ahead)
        return bool(ahead)

    def _check_buffer_restart(self) -> None:
        """A buffer that restarted forgot the grants of its predecessor: abandon their groups (it draws them again)."""
        if self.producer.buffer_restarts == self._buffer_restarts:
            return
        self._buffer_restarts = self.producer.buffer_restarts
        stale = [g for g in self.open_groups if g not in self.abandoned]
        if stale:
            log.warning("the buffer restarted: abandoning %d group(s) of its predecessor's grants (draws %s); the "
                        "new buffer draws them again", len(stale), sorted(self.open_groups[g].draw for g in stale))
        self.abandoned.update(stale)
        self.abandoned_groups += len(stale)
        self._deferred = []  # the dead buffer's grants: the new one draws them again

    def _publish(self, result: EpisodeResult) -> None:
        """Send a finished episode (its trained agents' samples, the other calls' rewards) to the buffer, waiting
        for credit if needed. The other rewards keep its trajectory score that of the colocated loop."""
        self.samples_made += len(result.samples)
        self.meter.tokens += sum(len(s.response_ids) for s in result.samples)
        if self.evaluations is not None and self.evaluations.take(result):
            return  # an evaluation episode: recorded there, never sent to the buffer
        group_id = result.request.group_id
        group = self.open_groups[group_id]
        group.remaining -= 1
        if group.remaining == 0:
            del self.open_groups[group_id]
        if result.outcome.dropped:
            self._drop(result, group_id, group)
        else:
            self.meter.episodes += 1
            self.meter.outcomes.add(result.outcome)
        if self._abandoned(group_id, group):
            return
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
        if self._abandoned(group_id, group):  # the wait for credit may have met a new buffer
            return
        self.producer.send_episode(group_id, self.group_size, result.request.episode_id, samples, frozen_rewards,
                                   draw=group.draw, prompt=group.prompt)
        for rejection in self.producer.pop_rejections():
            self.rejected[rejection.reason] += 1

    def _abandoned(self, group_id: str, group: _OpenGroup) -> bool:
        """Whether `group_id` is not to be sent: it had a dropped episode, or came from the grant of a buffer that
        has since restarted."""
        self._check_buffer_restart()
        if group_id not in self.abandoned:
            return False
        if group.remaining == 0:
            self.abandoned.discard(group_id)
        return True

    def _drop(self, result: EpisodeResult, group_id: str, group: _OpenGroup) -> None:
        """A dropped episode: its group cannot complete. The buffer is told once (it drops what arrived of the
        group and draws its draw again); the group's other episodes are not sent."""
        self.dropped_episodes += 1
        if result.failure is None:  # a plugin's failure was logged by the runner already
            log.warning("episode %s dropped: %s", result.request.episode_id, result.outcome.dropped)
        self._check_buffer_restart()  # a group of a dead buffer's grant is not the new buffer's to drop
        if group_id not in self.abandoned:
            self.producer.abandon_group(group_id, group.draw)
            self.abandoned.add(group_id)

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
            "rollout/abandoned_groups": float(self.abandoned_groups),
            **{f"rollout/rejected/{reason}": float(n) for reason, n in self.rejected.items()},
            "rollout/buffer_restarts": float(self.producer.buffer_restarts),
            "rollout/lost_episodes": float(self.producer.lost_episodes),
            "rollout/dropped_episodes": float(self.dropped_episodes),
            **self.runner.failure_scalars(),  # rollout/episodes_failed, rollout/episodes_over_bound/<reason>, ...
            "rollout/samples_made": float(self.samples_made),
            **(self.orchestra.metrics() if hasattr(self.orchestra, "metrics") else {}),
            **meter.outcomes.scalars(),
        }
        if self.evaluations is not None:
            scalars["rollout/eval_samples"] = float(self.evaluations.samples)
            scalars["rollout/eval_episodes"] = float(self.evaluations.episodes)
        for model, target in {**self.engines, **self.targets}.items():  # frozen models: their engine's (0)
            scalars[f"version/{model}"] = float(target.version)
        for model in self.receivers:
            scalars[f"weight_sync/{model}/pause_seconds"] = meter.apply_s[model]
        self.reports += 1
        self.writer.log(self.reports, scalars)
        meter.reset()
