"""Held-out evaluation during training (`eval.interval`): when one is due, its episodes, its report.

Both modes use these pieces; only who runs the episodes differs. The colocated loop runs an evaluation between
two steps, on its own engines, so it measures exactly one version. In the asynchronous pipeline rollout 0
runs it inside its episode stream, beside its training groups (`drmas.rollout.worker`): its questions take
group slots as they free up, its results go to the evaluation here and never to the buffer, and weight
pushes are taken between engine steps as always, so an evaluation never holds a push for longer than the
engine step in progress (a training group would hold it as long). The price: a push that lands during an
evaluation switches the questions still running to the newer weights. The report therefore names the
version it was started at (`version`, its TensorBoard step) and the range of versions that actually made
its tokens (`versions`, per model, from the samples' own `policy_version`).

Why rollout 0 and not a process of its own: a dedicated evaluator needs a copy of every model in memory (a
GPU of its own, on a GPU machine) and a place in every launcher, while rollout 0 already holds the newest
weights the moment a learner pushes them, and its batches have room: episodes wait on one model at a time,
so an evaluation's episodes mostly fill rows that would idle.

The questions, the sampling and the per-call seeds are those of `drmas eval` (`eval.k`, `eval.k_temperature`,
`eval.k_top_p`, `eval.benchmarks`, `eval.max_questions`; episode ids `eval/<benchmark>/q<i>/s<j>`): every
evaluation of a run draws the same seeds, so the curve moves with the weights rather than with the luck of
the draw, and a point of the colocated curve compares directly with `drmas eval` of that step's checkpoint.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from drmas.config.schema import DrmasConfig
from drmas.evaluation.behaviour import behaviour_stats
from drmas.evaluation.passk import score_table
from drmas.evaluation.sampling import question_requests
from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeResult, EpisodeRunner
from drmas.tasks.base import Problem


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


class RunningEvaluation:
    """One evaluation of the weights at `version`: hands out its episodes a question (k episodes) at a time,
    takes their results, and once every episode is in builds the report (`report()`)."""

    def __init__(self, cfg: DrmasConfig, version: int, benchmarks: Mapping[str, Sequence[Problem]],
                 agents: Mapping[str, AgentSpec], agent_names: Sequence[str]) -> None:
        self.cfg, self.version, self.k = cfg, version, cfg.eval.k
        self.agents, self.agent_names = agents, tuple(agent_names)
        self.started_at = time.monotonic()
        self._questions: deque[tuple[str, int, Problem]] = deque(
            (name, q, problem) for name, problems in benchmarks.items() for q, problem in enumerate(problems))
        self._rows: dict[str, list[list[Optional[EpisodeResult]]]] = {
            name: [[None] * self.k for _ in problems] for name, problems in benchmarks.items()}
        self._slot: dict[str, tuple[str, int, int]] = {}  # episode id -> (benchmark, question, sample)
        self._live: dict[tuple[str, int], int] = {}  # question handed out -> its episodes not finished
        self.missing = sum(len(problems) for problems in benchmarks.values()) * self.k

    @property
    def live_questions(self) -> int:
        """Questions handed out whose k episodes have not all finished (each holds a group slot)."""
        return len(self._live)

    @property
    def finished(self) -> bool:
        return self.missing == 0

    def next_requests(self, questions: int) -> list[EpisodeRequest]:
        """The episodes of up to `questions` more questions (none once all are handed out)."""
        requests: list[EpisodeRequest] = []
        for _ in range(min(questions, len(self._questions))):
            name, q, problem = self._questions.popleft()
            for s, request in enumerate(question_requests(name, q, problem, self.k, self.agents)):
                self._slot[request.episode_id] = (name, q, s)
                requests.append(request)
            self._live[(name, q)] = self.k
        return requests

    def owns(self, episode_id: str) -> bool:
        return episode_id in self._slot

    def record(self, result: EpisodeResult) -> None:
        name, q, s = self._slot.pop(result.request.episode_id)
        self._rows[name][q][s] = result
        self.missing -= 1
        self._live[(name, q)] -= 1
        if not self._live[(name, q)]:
            del self._live[(name, q)]

    def report(self) -> dict:
        """evals.jsonl's record: scores and behaviour per benchmark (the shapes of `drmas eval`'s eval.json),
        the version it was started at (its step) and the versions that made its tokens."""
        if not self.finished:
            raise RuntimeError(f"the evaluation of version {self.version} still misses {self.missing} episodes")
        versions: dict[str, list[int]] = {}
        samples = 0
        for rows in self._rows.values():
            for row in rows:
                for result in row:
                    for sample in result.samples:  # type: ignore[union-attr]
                        span = versions.setdefault(sample.model, [sample.policy_version, sample.policy_version])
                        span[0], span[1] = min(span[0], sample.policy_version), max(span[1], sample.policy_version)
                        samples += 1
        eval_cfg = self.cfg.eval
        return {
            "step": self.version,
            "version": self.version,
            "versions": versions,
            "benchmarks": {name: score_table([[r.outcome.reward for r in row] for row in rows])  # type: ignore[union-attr]
                           for name, rows in self._rows.items()},
            "behaviour": {name: behaviour_stats([r.outcome for row in rows for r in row], self.agent_names)  # type: ignore[union-attr]
                          for name, rows in self._rows.items()},
            "samples": samples,
            "sampling": {"k": self.k, "temperature": eval_cfg.k_temperature, "top_p": eval_cfg.k_top_p,
                         "seed": self.cfg.trainer.seed},
            "wall_seconds": time.monotonic() - self.started_at,
        }


def evaluate_now(runner: EpisodeRunner, evaluation: RunningEvaluation, questions_per_chunk: int) -> dict:
    """Run every episode of `evaluation` on `runner`, `questions_per_chunk` questions per `runner.run` call
    (bounding the episodes alive at once), and return its report: the colocated loop's evaluation."""
    while not evaluation.finished:
        for result in runner.run(evaluation.next_requests(questions_per_chunk)):
            evaluation.record(result)
    return evaluation.report()
