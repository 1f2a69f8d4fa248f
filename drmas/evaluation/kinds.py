"""The three kinds of evaluation, each a source and a sink for the one `Evaluator`, read from the config here.

| kind | source | sink | driven by |
|---|---|---|---|
| `heldout`: accuracy before / after training | the first `eval.n_problems` test problems, once each, at `eval.temperature`, ids `<tag>-<uid>` | `heldout.AccuracySink`: accuracy, n, valid share per agent, for the loop to log | colocated loop; async launcher |
| `interval`: `eval.interval` during training | `benchmark_source`: every benchmark, `eval.k` each | `evals_log.IntervalSink`: evals.jsonl, TensorBoard `eval/`, a console line | colocated loop between steps; rollout 0's stream; the launcher (final version) |
| `checkpoint`: `drmas eval` | `benchmark_source`, less the questions of an interrupted run | `outputs.EvalDirSink`: its directory (eval_questions.jsonl as it goes, eval.json / eval.md / TensorBoard) | `drmas eval` |

Only this module reads `eval.*` to decide which episodes run and how they are sampled; the evaluator and the
sinks take plain values. A new kind is one more function here (and a sink, if its results go somewhere new).

Both benchmark kinds sample alike (`eval.k`, `eval.k_temperature`, `eval.k_top_p`, `eval.benchmarks` or the
task's test split, `eval.max_questions`, per-call seeds from `trainer.seed` and the episode ids), so a point
of a run's `eval/` curve compares directly with `drmas eval` of that version's checkpoint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from drmas import assembly
from drmas.config.schema import DrmasConfig, EvalConfig
from drmas.core.errors import naming_key
from drmas.episodes import AgentSpec
from drmas.evaluation.evals_log import EvalLog, IntervalSink
from drmas.evaluation.evaluator import Done, EvalSource, Evaluator
from drmas.evaluation.heldout import AccuracySink
from drmas.evaluation.outputs import EvalDirSink
from drmas.tasks.base import Problem, Task

# Episodes alive at once per runner.run call, in units of the engine batch: a few batches keep the
# engine's batches full while episodes finish at different rounds, and bound memory on big benchmarks.
CHUNK_BATCHES = 4


def heldout(cfg: DrmasConfig, task: Task, tag: str) -> Evaluator:
    """Held-out accuracy `tag` ("before" / "after" training): one episode per problem, run in one call."""
    problems = list(task.split("test"))[: cfg.eval.n_problems]
    agents = assembly.agent_specs(cfg, temperature=cfg.eval.temperature)
    return Evaluator(EvalSource({"test": problems}, agents=agents, tag=tag), AccuracySink())


def interval(cfg: DrmasConfig, benchmarks: Mapping[str, Sequence[Problem]], version: int, evals: EvalLog,
             agent_names: Sequence[str], say: Callable[[str], None],
             versions: Optional[dict[str, list[int]]] = None) -> Evaluator:
    """eval.interval's evaluation of the weights at `version` into `evals`; `versions`: the versions that made
    its tokens when the samples cannot tell (engines loaded from a checkpoint stamp them 0)."""
    return Evaluator(benchmark_source(cfg, benchmarks), IntervalSink(evals, version, agent_names, say, versions))


def checkpoint(cfg: DrmasConfig, benchmarks: Mapping[str, Sequence[Problem]], out: Path, provenance: dict,
               agent_names: Sequence[str], kept: Sequence[dict] = (), done: Optional[Done] = None,
               on_question: Callable[[str], None] = lambda _: None) -> Evaluator:
    """`drmas eval` into its directory `out`; `kept` / `done`: the records and outcomes of the questions an
    interrupted run of it finished (`eval.resume`), which are not sampled again."""
    sink = EvalDirSink(out, provenance, agent_names, cfg.logging.tensorboard, kept, on_question)
    return Evaluator(benchmark_source(cfg, benchmarks), sink, done)


def benchmark_source(cfg: DrmasConfig, benchmarks: Mapping[str, Sequence[Problem]]) -> EvalSource:
    """`eval.k` episodes per question of every benchmark, sampled as `eval_agent_specs` says, run a few
    engine batches at a time (`CHUNK_BATCHES`)."""
    per_call = max(1, CHUNK_BATCHES * cfg.rollout.max_batch_size // cfg.eval.k)
    return EvalSource(benchmarks, cfg.eval.k, eval_agent_specs(cfg), sampling=sampling_record(cfg), per_call=per_call)


def sampling_record(cfg: DrmasConfig) -> dict:
    """How the benchmark kinds' reports record their sampling (`sampling` of evals.jsonl and eval.json)."""
    return {"k": cfg.eval.k, "temperature": cfg.eval.k_temperature, "top_p": cfg.eval.k_top_p, "seed": cfg.trainer.seed}


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
