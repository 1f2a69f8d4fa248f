"""eval.interval in a rollout's episode stream: rollout 0 evaluates the newest weights beside its training.

Why here and what it costs is in `drmas.evaluation.interval`. The rules this class keeps:

* an evaluation starts when the trained models' version (the lowest of them, as the engines hold it) reaches
  the next multiple of `eval.interval`; the versions are read between engine steps, so it starts on weights
  that just arrived;
* its questions (k episodes each) take the slots of training groups as those finish ("between groups"), at
  most half of the rollout's groups at once, so the rollout keeps feeding the learners while it evaluates;
* its results come back through `take`, which the rollout asks before anything else: they are recorded here
  (`<output_dir>/eval/evals.jsonl` and its TensorBoard) and never reach the buffer (which never admitted them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from drmas.config.schema import DrmasConfig
from drmas.evaluation.evals_log import ASYNC_EVAL_DIR, EvalLog, summary_line
from drmas.evaluation.interval import IntervalSchedule, RunningEvaluation
from drmas.evaluation.sampling import eval_agent_specs, load_benchmarks
from drmas.episodes import EpisodeRequest, EpisodeResult
from drmas.tasks.base import Task

log = logging.getLogger(__name__)


class StreamEvaluations:
    def __init__(self, cfg: DrmasConfig, task: Task, agent_names: Sequence[str], group_slots: int) -> None:
        self.cfg = cfg
        self.benchmarks = load_benchmarks(cfg, task)  # a bad benchmark file stops the rollout before it starts
        self.agents = eval_agent_specs(cfg)
        self.agent_names = tuple(agent_names)
        self.evals = EvalLog(Path(cfg.trainer.output_dir) / ASYNC_EVAL_DIR, tensorboard=cfg.logging.tensorboard)
        self.schedule = IntervalSchedule(cfg.eval.interval, done=self.evals.done)
        self.max_slots = max(1, group_slots // 2)
        self.running: RunningEvaluation | None = None
        self.samples = 0  # samples made by evaluation episodes (never sent anywhere)
        self.episodes = 0

    @property
    def slots(self) -> int:
        """Group slots the evaluation holds now (its questions in progress)."""
        return self.running.live_questions if self.running is not None else 0

    def admit(self, version: int, free_slots: int) -> list[EpisodeRequest]:
        """Start an evaluation of `version` if one is due; the episodes of as many of its questions as fit."""
        if self.running is None and self.schedule.due(version):
            self.schedule.started(version)
            self.running = RunningEvaluation(self.cfg, version, self.benchmarks, self.agents, self.agent_names)
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
            report = self.running.report()
            self.evals.write(report)
            log.info(summary_line(report))
            self.running = None
        return True

    def close(self) -> None:
        self.evals.close()
