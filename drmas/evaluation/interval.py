"""Held-out evaluation during training (`eval.interval`): which versions, each one's evaluator, rollout 0's feed.

Its episodes and its report are `kinds.interval` (the evaluator's source and sink); both modes start it from
`IntervalEvaluations` here, and only who runs the episodes differs. The colocated loop runs an evaluation
between two steps, on its own engines, so it measures exactly one version. In the asynchronous pipeline
rollout 0 runs it inside its episode stream, beside its training groups (`StreamEvaluations`): its
questions take group slots as they free up, its results go to the evaluator and never to the buffer, and weight
pushes are taken between engine steps as always, so an evaluation never holds a push for longer than the
engine step in progress (a training group would hold it as long). The price: a push that lands during an
evaluation switches the questions still running to the newer weights. The report therefore names the
version it was started at (`version`, its TensorBoard step) and the range of versions that actually made
its tokens (`versions`, per model, from the samples' own `policy_version`).

Why rollout 0 and not a process of its own: a dedicated evaluator needs a copy of every model in memory (a
GPU of its own, on a GPU machine) and a place in every launcher, while rollout 0 already holds the newest
weights the moment a learner pushes them, and its batches have room: episodes wait on one model at a time,
so an evaluation's episodes mostly fill rows that would idle.

The rules `StreamEvaluations` keeps in rollout 0 (`drmas.rollout.worker` asks it):

* an evaluation starts when the trained models' version (the lowest of them, as the engines hold it) reaches
  the next multiple of `eval.interval`; the versions are read between engine steps, so it starts on weights
  that just arrived;
* its questions (k episodes each) take the slots of training groups as those finish ("between groups"), at
  most half of the rollout's groups at once, so the rollout keeps feeding the learners while it evaluates;
* its results come back through `take`, which the rollout asks before anything else: they go to the evaluator
  (its sink writes `<output_dir>/eval/evals.jsonl` and its TensorBoard) and never reach the buffer (which
  never admitted them).

The questions, the sampling and the per-call seeds are those of `drmas eval` (`kinds.benchmark_source`): every
evaluation of a run draws the same seeds, so the curve moves with the weights rather than with the luck of
the draw, and a point of the colocated curve compares directly with `drmas eval` of that step's checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from drmas.config.schema import DrmasConfig
from drmas.episodes import EpisodeRequest, EpisodeResult
from drmas.evaluation import kinds
from drmas.evaluation.evals_log import ASYNC_EVAL_DIR, EvalLog
from drmas.evaluation.evaluator import Evaluator
from drmas.tasks.base import Problem, Task

log = logging.getLogger(__name__)


@dataclass
class IntervalSchedule:
    """Which versions to evaluate: every `interval`-th (0, N, 2N, ...). A version past a missed multiple (an
    evaluation still running when it came, or a resume between two) is evaluated when next seen instead.
    `done`: the newest version evaluated (from evals.jsonl on a resume), None before the first."""

    interval: int
    done: Optional[int] = None

    def due(self, version: int) -> bool:
        if self.interval <= 0:
            return False
        if self.done is None:
            return True
        return version >= (self.done // self.interval + 1) * self.interval

    def started(self, version: int) -> None:
        self.done = version


class IntervalEvaluations:
    """A run's evaluations during training: `due(version)` starts the evaluation of `version` when the
    schedule says so (None otherwise), its report going to `evals` and its console line to `say`."""

    def __init__(self, cfg: DrmasConfig, benchmarks: Mapping[str, Sequence[Problem]], evals: EvalLog,
                 agent_names: Sequence[str], say: Callable[[str], None]) -> None:
        self.cfg, self.benchmarks, self.evals, self.agent_names, self.say = cfg, benchmarks, evals, agent_names, say
        self.schedule = IntervalSchedule(cfg.eval.interval, done=evals.done)

    def due(self, version: int) -> Optional[Evaluator]:
        if not self.schedule.due(version):
            return None
        self.schedule.started(version)
        return kinds.interval(self.cfg, self.benchmarks, version, self.evals, self.agent_names, self.say)


class StreamEvaluations:
    """Rollout 0's evaluations: the rules in the module docstring."""

    def __init__(self, cfg: DrmasConfig, task: Task, agent_names: Sequence[str], group_slots: int) -> None:
        self.evals = EvalLog(Path(cfg.trainer.output_dir) / ASYNC_EVAL_DIR, tensorboard=cfg.logging.tensorboard)
        # a bad benchmark file stops the rollout before it starts
        self.intervals = IntervalEvaluations(cfg, kinds.load_benchmarks(cfg, task), self.evals, agent_names, log.info)
        self.max_slots = max(1, group_slots // 2)
        self.running: Evaluator | None = None
        self.samples = 0  # samples made by evaluation episodes (never sent anywhere)
        self.episodes = 0

    @property
    def slots(self) -> int:
        """Group slots the evaluation holds now (its questions in progress)."""
        return self.running.live_questions if self.running is not None else 0

    def admit(self, version: int, free_slots: int) -> list[EpisodeRequest]:
        """Start an evaluation of `version` if one is due; the episodes of as many of its questions as fit."""
        if self.running is None:
            self.running = self.intervals.due(version)
            if self.running is not None:
                log.info("evaluating version %d beside training (%d episodes)", version, self.running.missing)
        if self.running is None:
            return []
        return self.running.next_requests(max(0, min(free_slots, self.max_slots - self.running.live_questions)))

    def take(self, result: EpisodeResult) -> bool:
        """Record `result` if it is an evaluation episode (True); False for a training episode."""
        if self.running is None or not self.running.owns(result.request.episode_id):
            return False
        self.samples += len(result.samples)
        self.episodes += 1
        self.running.record(result)
        if self.running.finished:
            self.running.report()  # into evals.jsonl and the log
            self.running = None
        return True

    def close(self) -> None:
        self.evals.close()
