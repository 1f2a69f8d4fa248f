"""Build the run's components from a resolved config: task, orchestra, agent specs, engines, model directories.

Shared by the colocated loop, evaluation and the buffer, rollout and learner processes, so every process
interprets a config the same way. Importing it registers the built-in engines, orchestras, role agents,
tasks and retrievers. `load_config` is how every entry point loads a config: it imports the config's plugins
(and the installed `drmas.plugins` entry points, `drmas.plugins`) so their registrations exist, the config
package reads and checks the settings (`system.*` / `task.*` with the settings class the chosen system and
task registered), and the names that select a registered component are checked here, against the
registries, before any process starts or any model is built.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

import drmas.engines.embedded  # noqa: F401  (registers the built-in engine)
import drmas.mas.math  # noqa: F401  (registers the built-in orchestras and role agents)
import drmas.mas.revise  # noqa: F401
import drmas.mas.search  # noqa: F401
from drmas.config.derived import trained_agent_models, trained_agents, trained_models  # noqa: F401
from drmas.config.errors import ConfigError
from drmas.config.load import build_config, plugin_specs, read_layers
from drmas.config.schema import AgentConfig, DrmasConfig
from drmas.engines import ENGINES
from drmas.engines.base import SamplingParams
from drmas.mas import ORCHESTRAS
from drmas.mas.agents import AGENT_ROLES, RoleAgent
from drmas.mas.base import Orchestra
from drmas.models.loading import resolve_model_path
from drmas.plugins import import_plugins
from drmas.retrieval.factory import RETRIEVERS, build_retriever
from drmas.rollout.episodes import AgentSpec
from drmas.runtime import process
from drmas.tasks import TASKS
from drmas.tasks import build_task as _build_task
from drmas.tasks.base import Task


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DrmasConfig:
    """The config as every entry point loads it: its plugins imported, read and checked, and every registered
    name in it checked (ConfigError naming the key)."""
    layers = read_layers(path, overrides)
    import_plugins(plugin_specs(layers))
    cfg = build_config(layers)
    problems = check_components(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return cfg


def load_plugins(path: str | Path | None = None, overrides: Sequence[str] = ()) -> None:
    """Import the plugins a config names (and the installed entry points) without reading the rest of it."""
    import_plugins(plugin_specs(read_layers(path, overrides)))


def load_or_exit(prog: str, path: str | None, overrides: Sequence[str]) -> DrmasConfig:
    """`load_config` for a process's entry point: the config, or exit 2 with the config error (before any
    socket or model is touched)."""
    return process.load_or_exit(prog, path, overrides, loader=load_config)


def check_components(cfg: DrmasConfig) -> list[str]:
    """What is wrong with the config's choice of registered components, each message naming its key.
    (`pipeline.launcher` is checked by `drmas.launch.launch`, the one caller of launchers.)"""
    found = [problem + _PLUGIN_HINT for key, value, registry in (
        ("system.name", cfg.system.name, ORCHESTRAS),
        ("task.name", cfg.task.name, TASKS),
        ("rollout.engine", cfg.rollout.engine, ENGINES),
        ("retrieval.backend", cfg.retrieval.backend, RETRIEVERS),
    ) if (problem := registry.problem(value, key))]
    if cfg.rollout.engine in ENGINES:
        found.extend(_engine_problems(cfg))
    for name, agent in cfg.agents.items():
        found.extend(_agent_problems(name, agent))
    return found


_PLUGIN_HINT = " (a plugin's names are known once its module is listed under `plugins` or installed with a "\
    "`drmas.plugins` entry point)"
_SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens")


def role_of(agent: AgentConfig) -> type[RoleAgent] | None:
    """The registered role class an agent plays (None: a role no module registered, which the orchestra
    handles itself)."""
    return AGENT_ROLES.get(agent.role) if agent.role in AGENT_ROLES else None


def _agent_problems(name: str, agent: AgentConfig) -> list[str]:
    """A scripted role's agent has no model and no sampling; any other agent needs a model."""
    role, where = role_of(agent), f"agents.{name}"
    if role is None or not role.scripted:
        return [] if agent.model else [f"{where}.model: required (a key of 'models'); only an agent whose role is "
                                       f"scripted takes none, and role {agent.role!r} is not"]
    found = []
    if agent.model:
        found.append(f"{where}.model: role {agent.role!r} is scripted (its turns are computed by code): its agent is "
                     f"served by no model; remove the key")
    sampling = [key for key in _SAMPLING_KEYS if getattr(agent, key) is not None] + (["stop"] if agent.stop else [])
    if sampling:
        found.append(f"{where}: role {agent.role!r} is scripted: {', '.join(sampling)} would sample nothing; remove "
                     f"{'them' if len(sampling) > 1 else 'it'}")
    return found


def _engine_problems(cfg: DrmasConfig) -> list[str]:
    """Settings the chosen engine cannot honour: vLLM arguments for an engine that takes none, and top_p < 1
    for training on an engine whose reported log-probs are those of the top-p truncated distribution (the
    learner recomputes the full softmax(logits / T), so training on them would weight tokens wrongly)."""
    r, engine = cfg.rollout, ENGINES.get(cfg.rollout.engine)
    found = []
    if r.engine_args and not getattr(engine, "takes_engine_args", False):
        found.append(f"rollout.engine_args: {sorted(r.engine_args)} are vLLM arguments; rollout.engine={r.engine!r} "
                     "takes none")
    if not getattr(engine, "truncates_top_p", False):
        return found
    offending: dict[tuple[str, float], list[str]] = {}  # (key, top_p) -> trained agents sampling with it
    for name, a in cfg.agents.items():
        top_p = a.top_p if a.top_p is not None else r.top_p
        if a.trainable and top_p < 1 and a.model in cfg.models and cfg.models[a.model].trainable:
            key = f"agents.{name}.top_p" if a.top_p is not None else "rollout.top_p"
            offending.setdefault((key, top_p), []).append(name)
    for (key, top_p), agents in offending.items():
        found.append(
            f"{key}: {top_p} with rollout.engine={r.engine}: it reports log-probs of the top-p truncated "
            "distribution while the learner recomputes the full softmax(logits / T), so the importance weights of "
            f"{', '.join(agents)} would be wrong; train with top_p=1 (evaluation may use any top_p)")
    return found


def require_packages(cfg: DrmasConfig) -> None:
    """ValueError naming the key when a component the config chooses needs a package this machine lacks (the
    vLLM engine): asked where the components will run, before anything starts, rather than in
    `check_components`, so a config for a GPU cluster can still be shown and checked on a laptop."""
    engine = ENGINES.get(cfg.rollout.engine)
    needs = getattr(engine, "needs", None)  # (module, how to install it)
    if needs is not None and importlib.util.find_spec(needs[0]) is None:
        raise ValueError(f"rollout.engine={cfg.rollout.engine}: the {needs[0]} package is not installed here: "
                         f"{needs[1]}")


def build_task(cfg: DrmasConfig) -> Task:
    return _build_task(cfg.task)


def build_orchestra(cfg: DrmasConfig, task: Task) -> Orchestra:
    agents_by_role = {a.role: name for name, a in cfg.agents.items()}
    factory = ORCHESTRAS.get(cfg.system.name)
    extra = {}
    if getattr(factory, "needs_retriever", False):  # the search system: its retriever is built from `retrieval`
        extra["retriever"] = build_retriever(cfg.retrieval, task,
                                             show_progress=process.progress_bars_on(cfg.logging.progress_bar))
        extra["topk"] = cfg.retrieval.topk
    return factory(cfg.system, agents_by_role, task, **extra)


def agent_specs(cfg: DrmasConfig, temperature: float | None = None) -> dict[str, AgentSpec]:
    """Sampling parameters per agent: the agent's overrides over the rollout defaults (`temperature`, when
    given, replaces every agent's temperature, as evaluation does), and its role's stop strings followed by its
    own (`agents.<name>.stop`). An agent of a scripted role gets its role's `respond` instead."""
    specs = {}
    for name, a in cfg.agents.items():
        role = role_of(a)
        if role is not None and role.scripted:
            specs[name] = AgentSpec(model="", sampling=None, script=role().respond)  # type: ignore[attr-defined]
            continue
        temp = a.temperature if a.temperature is not None else cfg.rollout.temperature
        if temperature is not None:
            temp = temperature
        sampling = SamplingParams(
            temperature=temp,
            top_p=a.top_p if a.top_p is not None else cfg.rollout.top_p,
            max_new_tokens=a.max_new_tokens or cfg.rollout.max_new_tokens,
            stop=tuple(dict.fromkeys([*(role.stop if role is not None else ()), *a.stop])),  # the role's, then its own
        )
        specs[name] = AgentSpec(model=a.model, sampling=sampling)
    return specs


def build_engine(cfg: DrmasConfig, model_id: str, path: Path, seed: int):
    """The configured engine (`rollout.engine`, `rollout.engine_args`) serving `model_id` from `path`, in the
    model's compute dtype (the precision its learner computes in, see `drmas.models.devices`)."""
    from drmas.models.loading import compute_dtype

    factory = ENGINES.lookup(cfg.rollout.engine, "rollout.engine")
    mcfg = cfg.models[model_id]
    return factory(model_id, path, compute_dtype(mcfg), cfg.rollout.max_batch_size, seed,
                   engine_args=dict(cfg.rollout.engine_args), device=mcfg.device)


def model_path(cfg: DrmasConfig, model_id: str) -> Path:
    return resolve_model_path(cfg.models[model_id], where=f"models.{model_id}")
