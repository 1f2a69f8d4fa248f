"""One evaluator for every evaluation: a source of questions, a sink of results, and either loop drives it.

The three kinds of evaluation (held-out accuracy before and after training, `eval.interval` during training,
`drmas eval` of a checkpoint) differ only in *which* episodes they run and *where* the results go, so each is
a source and a sink (built in `kinds.py`) handed to this one `Evaluator`:

* `EvalSource`: the questions (benchmark name -> problems), k episodes each, their sampling (None: the
  runner's own) and their episode ids, which also seed every call (`EpisodeRunner(seed=...)` derives each
  call's seed from (seed, episode id, turn)): `eval/<benchmark>/q<i>/s<j>` for avg@k / pass@k, so every
  evaluation of a run, and `drmas eval` of any of its checkpoints, draws the same random numbers and two
  versions' scores differ by their weights rather than their luck; `<tag>-<uid>` for held-out accuracy;
* `EvalSink`: told each finished question (`question`: `drmas eval` streams them to a file it can resume
  from), and asked for the report once every episode is in (`report`: it writes it wherever it belongs).

Whoever runs the episodes drives the evaluator one of two ways: `run(runner)` runs them on an `EpisodeRunner`,
a few questions per call (the colocated loop, the launcher, `drmas eval`); inside an episode stream (rollout 0,
`interval.StreamEvaluations`) `next_requests` hands out questions as slots free up and `record` takes each result.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional, Sequence

from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeResult, EpisodeRunner
from drmas.evaluation.behaviour import behaviour_stats
from drmas.evaluation.passk import score_table
from drmas.mas.base import EpisodeOutcome
from drmas.tasks.base import Problem

Done = Mapping[tuple[str, str], Sequence[EpisodeOutcome]]  # (benchmark, uid) -> the k outcomes of a question


@dataclass(frozen=True)
class EvalSource:
    """Which episodes an evaluation runs: `k` per question of every benchmark, sampled with `agents` (None:
    as the runner samples), ids `eval/<benchmark>/q<i>/s<j>`, or `<tag>-<uid>` with a `tag` (k must be 1).
    `sampling`: how the reports record the sampling (`{"k", "temperature", "top_p", "seed"}`); `per_call`:
    questions per `runner.run` call when run directly (bounding the episodes alive at once; 0: all in one)."""

    benchmarks: Mapping[str, Sequence[Problem]]
    k: int = 1
    agents: Optional[Mapping[str, AgentSpec]] = None
    tag: Optional[str] = None
    sampling: dict = field(default_factory=dict)
    per_call: int = 0

    def __post_init__(self) -> None:
        if self.tag is not None and self.k != 1:
            raise ValueError(f"a tagged evaluation has one episode per question (its ids name no sample), got k={self.k}")

    def requests(self, name: str, index: int, problem: Problem) -> list[EpisodeRequest]:
        """The k episodes of question `index` of benchmark `name`."""
        if self.tag is not None:
            episode = f"{self.tag}-{problem.uid}"
            return [EpisodeRequest(episode, episode, problem, self.agents)]
        group = f"eval/{name}/q{index}"
        return [EpisodeRequest(f"{group}/s{s}", group, problem, self.agents) for s in range(self.k)]


@dataclass(frozen=True)
class Scored:
    """A finished episode as an evaluation keeps it: its outcome and, per sample it made, (agent, valid, model,
    version); not the samples themselves, whose tokens a large `drmas eval` could not hold."""

    outcome: EpisodeOutcome
    calls: tuple[tuple[str, bool, str, int], ...] = ()

    @classmethod
    def of(cls, result: EpisodeResult) -> Scored:
        return cls(result.outcome, tuple((s.agent, s.valid, s.model, s.policy_version) for s in result.samples))


class EvalSink:
    """Where an evaluation's results go; a sink overrides `report`, and `question` / `close` if it needs them."""

    def question(self, benchmark: str, problem: Problem, outcomes: list[EpisodeOutcome]) -> None:
        """A question's k episodes have finished (never called for questions taken from `done`)."""

    def report(self, evaluation: Evaluator) -> dict:
        """Every episode is in: build the report from `evaluation`, write it where it goes, return it."""
        raise NotImplementedError

    def close(self) -> None:
        """The evaluation is over, finished or not: let go of what the sink holds open."""


class Evaluator:
    """One evaluation: hands out its source's episodes a question (k episodes) at a time, takes their results,
    tells the sink of every finished question and, once all are in, has it report. `done`: questions already
    answered (an interrupted `drmas eval` resumed), taken as they are and never run."""

    def __init__(self, source: EvalSource, sink: EvalSink, done: Optional[Done] = None) -> None:
        self.source, self.sink, self.k = source, sink, source.k
        self.started_at = time.monotonic()
        done = done or {}
        self.rows: dict[str, list[list[Optional[Scored]]]] = {
            name: [[Scored(o) for o in done[(name, p.uid)]] if (name, p.uid) in done else [None] * self.k
                   for p in problems]
            for name, problems in source.benchmarks.items()}
        self._questions: deque[tuple[str, int, Problem]] = deque(
            (name, q, p) for name, problems in source.benchmarks.items() for q, p in enumerate(problems)
            if (name, p.uid) not in done)
        self._slot: dict[str, tuple[str, int, int, Problem]] = {}  # episode id -> (benchmark, question, sample, problem)
        self._live: dict[tuple[str, int], int] = {}  # question handed out -> its episodes not finished
        self.missing = len(self._questions) * self.k
        self.resumed = sum(len(problems) for problems in source.benchmarks.values()) - len(self._questions)

    @property
    def live_questions(self) -> int:
        """Questions handed out whose k episodes have not all finished (in a stream each holds a group slot)."""
        return len(self._live)

    @property
    def finished(self) -> bool:
        return self.missing == 0

    def next_requests(self, questions: int) -> list[EpisodeRequest]:
        """The episodes of up to `questions` more questions (none once all are handed out)."""
        requests: list[EpisodeRequest] = []
        for _ in range(min(questions, len(self._questions))):
            name, q, problem = self._questions.popleft()
            for s, request in enumerate(self.source.requests(name, q, problem)):
                self._slot[request.episode_id] = (name, q, s, problem)
                requests.append(request)
            self._live[(name, q)] = self.k
        return requests

    def owns(self, episode_id: str) -> bool:
        return episode_id in self._slot

    def record(self, result: EpisodeResult) -> None:
        name, q, s, problem = self._slot.pop(result.request.episode_id)
        row = self.rows[name][q]
        row[s] = Scored.of(result)
        self.missing -= 1
        self._live[(name, q)] -= 1
        if not self._live[(name, q)]:
            del self._live[(name, q)]
            self.sink.question(name, problem, [scored.outcome for scored in row])  # type: ignore[union-attr]

    def report(self) -> dict:
        if not self.finished:
            raise RuntimeError(f"the evaluation still misses {self.missing} episodes")
        return self.sink.report(self)

    def run(self, runner: EpisodeRunner, questions_per_call: Optional[int] = None) -> dict:
        """Run every episode on `runner`, `questions_per_call` questions per `runner.run` call (None: the
        source's `per_call`; 0: all in one call), and return the sink's report."""
        per_call = self.source.per_call if questions_per_call is None else questions_per_call
        per_call = per_call or len(self._questions)
        while not self.finished:
            for result in runner.run(self.next_requests(per_call)):
                self.record(result)
        return self.report()

    # ---- what the sinks read ------------------------------------------------------------------------
    def scores(self, agent_names: Sequence[str]) -> dict:
        """The report's fixed shape, one for every kind that reports it: per benchmark `benchmarks` (avg@k,
        pass@k, k, n_questions) and `behaviour` (per agent of `agent_names` and per episode statistic)."""
        return {
            "benchmarks": {name: score_table([[float(o.reward) for o in row] for row in self.outcomes(name)])
                           for name in self.rows},
            "behaviour": {name: behaviour_stats([o for row in self.outcomes(name) for o in row], agent_names)
                          for name in self.rows},
        }

    def outcomes(self, name: str) -> list[list[EpisodeOutcome]]:
        """Benchmark `name`'s outcome table: one row of k outcomes per question, in question order."""
        return [[scored.outcome for scored in row] for row in self.rows[name]]  # type: ignore[union-attr]

    def calls(self) -> Iterator[tuple[str, bool, str, int]]:
        """(agent, valid, model, version) of every sample made, in question order."""
        for rows in self.rows.values():
            for row in rows:
                for scored in row:
                    yield from scored.calls  # type: ignore[union-attr]
