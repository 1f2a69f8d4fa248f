"""k sampled episodes per question: the benchmarks, the sampling parameters, the chunked episode runs.

Every episode id is `eval/<benchmark>/q<index>/s<sample>`, and `EpisodeRunner(seed=trainer.seed)` derives
each call's sampling seed from (seed, episode id, turn): the same config, checkpoint and seed sample the
same tokens whatever the chunk size or batch composition, so evaluations are reproducible.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from drmas import assembly
from drmas.config.schema import DrmasConfig, EvalConfig
from drmas.core.errors import naming_key
from drmas.mas.base import EpisodeOutcome
from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeRunner
from drmas.tasks.base import Problem, Task


def validate_eval_config(cfg: EvalConfig) -> None:
    """ValueError naming the `eval.*` key whose value `drmas eval` cannot use."""
    if cfg.k < 1:
        raise ValueError(f"eval.k must be >= 1, got {cfg.k}")
    if cfg.k_temperature < 0:
        raise ValueError(f"eval.k_temperature must be >= 0, got {cfg.k_temperature}")
    if not 0 < cfg.k_top_p <= 1:
        raise ValueError(f"eval.k_top_p must be in (0, 1], got {cfg.k_top_p}")
    if cfg.max_questions < 0:
        raise ValueError(f"eval.max_questions must be >= 0 (0: all), got {cfg.max_questions}")
    for name, path in cfg.benchmarks.items():
        if not name.strip() or "/" in name:
            raise ValueError(f"eval.benchmarks: name {name!r} must be non-empty and without '/'")
        if not str(path).strip():
            raise ValueError(f"eval.benchmarks.{name}: the file path is empty")


def eval_agent_specs(cfg: DrmasConfig) -> dict[str, AgentSpec]:
    """Every agent's sampling with temperature and top_p replaced by eval.k_temperature / eval.k_top_p
    (response lengths stay as configured)."""
    specs = assembly.agent_specs(cfg, temperature=cfg.eval.k_temperature)
    return {
        name: spec if spec.sampling is None  # a scripted agent samples nothing
        else dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, top_p=cfg.eval.k_top_p))
        for name, spec in specs.items()
    }


def load_benchmarks(cfg: DrmasConfig, task: Task) -> dict[str, list[Problem]]:
    """Benchmark name -> questions (at most eval.max_questions each). `eval.benchmarks` files are read by
    the task's `load_benchmark(path)`; with none configured the one benchmark is the task's test split,
    named after the task."""
    if cfg.eval.benchmarks:
        loader = getattr(task, "load_benchmark", None)
        if loader is None:
            raise ValueError(
                f"eval.benchmarks: task {cfg.task.name!r} cannot load benchmark files (it has no load_benchmark); "
                "leave eval.benchmarks empty to evaluate its test split"
            )
        benchmarks = {}
        for name, path in cfg.eval.benchmarks.items():
            try:
                benchmarks[name] = list(loader(path))
            except (FileNotFoundError, ValueError) as exc:
                raise naming_key(f"eval.benchmarks.{name}", exc) from None
    else:
        benchmarks = {cfg.task.name: list(task.split("test"))}
    if cfg.eval.max_questions:
        benchmarks = {name: problems[: cfg.eval.max_questions] for name, problems in benchmarks.items()}
    for name, problems in benchmarks.items():
        if not problems:
            where = f"eval.benchmarks.{name}" if cfg.eval.benchmarks else f"the test split of task {name!r}"
            raise ValueError(f"{where}: no questions to evaluate")
    return benchmarks


def question_requests(name: str, index: int, problem: Problem, k: int,
                      agents: Mapping[str, AgentSpec] | None = None) -> list[EpisodeRequest]:
    """The k episodes of question `index` of benchmark `name`, ids `eval/<name>/q<index>/s<sample>`: every
    evaluation of a run samples with the same per-call seeds (see the module docstring), so two versions'
    scores differ by their weights, not by their luck. `agents`: the evaluation's sampling, when the runner
    samples otherwise (training)."""
    return [EpisodeRequest(f"eval/{name}/q{index}/s{s}", f"eval/{name}/q{index}", problem, agents) for s in range(k)]


@dataclass
class BenchmarkSamples:
    """The k outcomes of every question of one benchmark, in question order."""

    name: str
    problems: list[Problem]
    outcomes: list[list[EpisodeOutcome]] = field(default_factory=list)

    @property
    def rewards(self) -> list[list[float]]:
        """The outcome table (one row of k task rewards per question)."""
        return [[float(o.reward) for o in row] for row in self.outcomes]

    def flat_outcomes(self) -> list[EpisodeOutcome]:
        return [o for row in self.outcomes for o in row]


def sample_benchmark(
    runner: EpisodeRunner,
    name: str,
    problems: Sequence[Problem],
    k: int,
    questions_per_chunk: int,
    on_chunk: Callable[[str, list[Problem], list[list[EpisodeOutcome]]], None] = lambda *_: None,
    done: Mapping[str, list[EpisodeOutcome]] | None = None,
) -> BenchmarkSamples:
    """Run k episodes per question, `questions_per_chunk` questions per `runner.run` call (bounding the
    episodes alive at once); `on_chunk(name, problems, outcomes)` gets each finished chunk's questions and
    their k outcomes each, so progress and per-question results can be recorded as they come.

    `done` maps question uids to the k outcomes of an earlier, interrupted evaluation: those questions are
    taken as they are and not sampled again (nor passed to `on_chunk`)."""
    if questions_per_chunk < 1:
        raise ValueError(f"questions_per_chunk must be >= 1, got {questions_per_chunk}")
    done = done or {}
    result = BenchmarkSamples(name, list(problems))
    for start in range(0, len(problems), questions_per_chunk):
        chunk = range(start, min(start + questions_per_chunk, len(problems)))
        todo = [q for q in chunk if problems[q].uid not in done]
        requests = [r for q in todo for r in question_requests(name, q, problems[q], k)]
        episodes = runner.run(requests) if requests else []
        fresh = {q: [e.outcome for e in episodes[i * k : (i + 1) * k]] for i, q in enumerate(todo)}
        result.outcomes.extend(fresh[q] if q in fresh else done[problems[q].uid] for q in chunk)
        if todo:
            on_chunk(name, [problems[q] for q in todo], [fresh[q] for q in todo])
    return result
