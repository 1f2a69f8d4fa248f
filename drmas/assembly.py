"""Build the run's components from a resolved config: task, orchestra, agent specs, model directories.

Shared by the colocated loop, evaluation and the buffer, rollout and learner processes, so every process
interprets a config the same way.
"""

from __future__ import annotations

from pathlib import Path

from drmas.config.schema import DrmasConfig
from drmas.engines.base import SamplingParams
from drmas.mas.base import Orchestra
from drmas.rollout.episodes import AgentSpec
from drmas.tasks.base import Task


def register_builtins() -> None:
    """Import the modules whose import registers the built-in engines, orchestras and tasks."""
    import drmas.engines.embedded  # noqa: F401
    import drmas.mas.math  # noqa: F401
    import drmas.mas.revise  # noqa: F401
    import drmas.mas.search  # noqa: F401
    import drmas.tasks  # noqa: F401


def build_task(cfg: DrmasConfig) -> Task:
    register_builtins()
    from drmas.tasks import build_task as _build

    return _build(cfg.task)


def build_orchestra(cfg: DrmasConfig, task: Task) -> Orchestra:
    register_builtins()
    from drmas.mas import ORCHESTRAS

    agents_by_role = {a.role: name for name, a in cfg.agents.items()}
    factory = ORCHESTRAS.get(cfg.system.name)
    extra = {}
    if getattr(factory, "needs_retriever", False):  # the search system: its retriever is built from `retrieval`
        from drmas.retrieval.factory import build_retriever

        extra["retriever"] = build_retriever(cfg.retrieval, task)
        extra["topk"] = cfg.retrieval.topk
    return factory(cfg.system, agents_by_role, task, **extra)


def agent_specs(cfg: DrmasConfig, temperature: float | None = None) -> dict[str, AgentSpec]:
    """Sampling parameters per agent: the agent's overrides over the rollout defaults (`temperature`, when
    given, replaces every agent's temperature, as evaluation does), and its role's stop strings."""
    register_builtins()
    from drmas.mas.agents import AGENT_ROLES

    specs = {}
    for name, a in cfg.agents.items():
        temp = a.temperature if a.temperature is not None else cfg.rollout.temperature
        if temperature is not None:
            temp = temperature
        sampling = SamplingParams(
            temperature=temp,
            top_p=a.top_p if a.top_p is not None else cfg.rollout.top_p,
            max_new_tokens=a.max_new_tokens or cfg.rollout.max_new_tokens,
            stop=AGENT_ROLES.get(a.role).stop if a.role in AGENT_ROLES else (),
        )
        specs[name] = AgentSpec(model=a.model, sampling=sampling)
    return specs


def build_engine(cfg: DrmasConfig, model_id: str, path: Path, seed: int):
    """The configured engine (`rollout.engine`, `rollout.engine_args`) serving `model_id` from `path`, in the
    model's compute dtype (the precision its learner computes in, see `drmas.devices`)."""
    register_builtins()
    from drmas.engines import ENGINES
    from drmas.models import compute_dtype

    factory = ENGINES.get(cfg.rollout.engine)
    mcfg = cfg.models[model_id]
    return factory(model_id, path, compute_dtype(mcfg), cfg.rollout.max_batch_size, seed,
                   engine_args=dict(cfg.rollout.engine_args), device=mcfg.device)


def model_path(cfg: DrmasConfig, model_id: str) -> Path:
    from drmas.models import resolve_model_path

    return resolve_model_path(cfg.models[model_id], where=f"models.{model_id}")


def trained_agents(cfg: DrmasConfig, model_id: str) -> list[str]:
    """Agents whose samples train `model_id`."""
    return [n for n, a in cfg.agents.items() if a.model == model_id and a.trainable]


def trained_models(cfg: DrmasConfig) -> list[str]:
    """Models that get a learner: trainable and trained by at least one agent (in the order of `models`)."""
    return [m for m, mcfg in cfg.models.items() if mcfg.trainable and trained_agents(cfg, m)]


def trained_agent_models(cfg: DrmasConfig) -> dict[str, str]:
    """Agent -> model for every agent whose samples train a model: what the buffer queues and learners pull."""
    return {a: m for m in trained_models(cfg) for a in trained_agents(cfg, m)}
