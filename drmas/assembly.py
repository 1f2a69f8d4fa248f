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

import dataclasses
import importlib.util
import warnings
from pathlib import Path
from typing import Callable, Mapping, Sequence

import drmas.gateway.orchestra  # noqa: F401  (registers the built-in orchestras and role agents)
import drmas.mas.math  # noqa: F401
import drmas.mas.revise  # noqa: F401
import drmas.mas.search  # noqa: F401
from drmas.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from drmas.config.derived import (  # noqa: F401
    engine_models,
    learner_process_of,
    learner_processes,
    model_config,
    model_ids,
    optim_config,
    split_model,
    trained_agent_models,
    trained_agents,
    trained_models,
)
from drmas.config.errors import ConfigError
from drmas.config.load import build_config, plugin_specs, read_layers
from drmas.config.schema import AgentConfig, DrmasConfig
from drmas.engines import ENGINES
from drmas.engines.base import AdapterSlot, Engine, SamplingParams
from drmas.mas import ORCHESTRAS
from drmas.mas.agents import AGENT_ROLES, RoleAgent
from drmas.mas.base import Orchestra
from drmas.core.tool_calls import TOOL_PARSERS
from drmas.models import checkpoint
from drmas.models.loading import resolve_model_path
from drmas.models.priming import PRIMING_FORMATS
from drmas.plugins import import_plugins
from drmas.retrieval.factory import RETRIEVERS, build_retriever
from drmas.episodes.bounds import EpisodeBounds
from drmas.episodes import AgentSpec, EpisodeRunner
from drmas.runtime import process
from drmas.tasks import TASKS
from drmas.tasks import build_task as _build_task
from drmas.tasks.base import Task
from drmas.tasks.sampler import ProblemSampler, order_change


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> DrmasConfig:
    """The config as every entry point loads it: its plugins imported, read and checked, and every registered
    name in it checked (ConfigError naming the key)."""
    layers = read_layers(path, overrides)
    import_plugins(plugin_specs(layers))
    cfg = build_config(layers)
    problems = check_components(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    if cfg.algorithm.normalization is not None:
        warnings.warn(f"algorithm.normalization is deprecated: write algorithm.estimator={cfg.algorithm.normalization} "
                      "(the same estimator)", FutureWarning, stacklevel=2)
    return cfg


def load_plugins(path: str | Path | None = None, overrides: Sequence[str] = ()) -> None:
    """Import the plugins a config names (and the installed entry points) without reading the rest of it."""
    import_plugins(plugin_specs(read_layers(path, overrides)))


def load_or_exit(prog: str, path: str | None, overrides: Sequence[str]) -> DrmasConfig:
    """`load_config` for a process's entry point: the config, or exit 2 with the config error (before any
    socket or model is touched)."""
    return process.load_or_exit(prog, path, overrides, loader=load_config)


def check_components(cfg: DrmasConfig) -> list[str]:
    """What is wrong with the config's choice of registered components, each message naming its key: an
    agent's role among them, unless the system takes roles as labels (`role_labels = True` on its factory: the
    external system). (`pipeline.launcher` is checked by `drmas.launch.launch`, the one caller of launchers.)"""
    found = [problem + _PLUGIN_HINT for key, value, registry in (
        ("system.name", cfg.system.name, ORCHESTRAS),
        ("task.name", cfg.task.name, TASKS),
        ("rollout.engine", cfg.rollout.engine, ENGINES),
        ("retrieval.backend", cfg.retrieval.backend, RETRIEVERS),
        ("algorithm.estimator" if cfg.algorithm.normalization is None else "algorithm.normalization",
         cfg.algorithm.chosen_estimator, ADVANTAGE_ESTIMATORS),
        ("algorithm.loss", cfg.algorithm.loss, POLICY_LOSSES),
    ) if (problem := registry.problem(value, key))]
    parser = getattr(cfg.system, "tool_parser", None)  # the external system's (or a plugin system's) setting
    if isinstance(parser, str) and (problem := TOOL_PARSERS.problem(parser, "system.tool_parser")):
        found.append(problem + _PLUGIN_HINT)
    for model_id, model in cfg.models.items():  # a tiny model's priming set: a built-in's or a plugin's
        if not model.path and model.builtin == "tiny" and model.tiny.prime_steps > 0:
            key = f"models.{model_id}.tiny.prime_system"
            if problem := PRIMING_FORMATS.problem(model.tiny.prime_system, key):
                found.append(problem + _PLUGIN_HINT)
            else:
                found.extend(PRIMING_FORMATS.get(model.tiny.prime_system).problems(key))
    if cfg.rollout.engine in ENGINES:
        found.extend(_engine_problems(cfg))
        with_adapters = [m for m in engine_models(cfg) if cfg.models[m].adapters]
        if with_adapters and not ENGINES.traits(cfg.rollout.engine).serves_adapters:
            found.append(f"rollout.engine: {cfg.rollout.engine!r} serves no LoRA adapters, and models."
                         f"{with_adapters[0]}.adapters needs an engine that does (embedded, vllm)")
    labels = cfg.system.name in ORCHESTRAS and getattr(ORCHESTRAS.get(cfg.system.name), "role_labels", False)
    own = system_roles(cfg)
    for name, agent in cfg.agents.items():
        if not labels and agent.role not in own and (problem := AGENT_ROLES.problem(agent.role, f"agents.{name}.role")):
            mine = f"; the {cfg.system.name!r} system's own roles: {', '.join(sorted(own))}" if own else ""
            found.append(problem + mine + _PLUGIN_HINT)
            continue
        found.extend(_agent_problems(name, agent, cfg))
    return found


_PLUGIN_HINT = " (a plugin's names are known once its module is listed under `plugins` or installed with a "\
    "`drmas.plugins` entry point)"
_SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens")


def system_roles(cfg: DrmasConfig) -> Mapping[str, type[RoleAgent]]:
    """The configured system's own roles (its factory's `system_roles`: role name -> class): names its agents may
    play besides the registered ones, which they shadow, so a plugin's `solver` need not be prefixed to stay
    clear of the built-in one or of another plugin's."""
    factory = ORCHESTRAS.get(cfg.system.name) if cfg.system.name in ORCHESTRAS else None
    return getattr(factory, "system_roles", None) or {}


def role_of(agent: AgentConfig, cfg: DrmasConfig) -> type[RoleAgent] | None:
    """The role class an agent plays: the system's own of that name, else the registered one (None: a label,
    which only a system with `role_labels` takes)."""
    own = system_roles(cfg)
    if agent.role in own:
        return own[agent.role]
    return AGENT_ROLES.get(agent.role) if agent.role in AGENT_ROLES else None


def _agent_problems(name: str, agent: AgentConfig, cfg: DrmasConfig) -> list[str]:
    """A scripted role's agent has no model and no sampling; any other agent needs a model."""
    role, where = role_of(agent, cfg), f"agents.{name}"
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
    r, engine = cfg.rollout, ENGINES.traits(cfg.rollout.engine)
    found = []
    if r.engine_args and not engine.takes_engine_args:
        found.append(f"rollout.engine_args: {sorted(r.engine_args)} are vLLM arguments; rollout.engine={r.engine!r} "
                     "takes none")
    if not engine.truncates_top_p:
        return found
    offending: dict[tuple[str, float], list[str]] = {}  # (key, top_p) -> trained agents sampling with it
    for name, a in cfg.agents.items():
        top_p = a.top_p if a.top_p is not None else r.top_p
        base = split_model(a.model)[0]
        if a.trainable and top_p < 1 and base in cfg.models and cfg.models[base].trainable:
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
    needs = ENGINES.traits(cfg.rollout.engine).needs  # (module, how to install it)
    if needs is not None and importlib.util.find_spec(needs[0]) is None:
        raise ValueError(f"rollout.engine={cfg.rollout.engine}: the {needs[0]} package is not installed here: "
                         f"{needs[1]}")


def build_task(cfg: DrmasConfig) -> Task:
    return _build_task(cfg.task)


def drawing_order(cfg: DrmasConfig, task: Task | None = None) -> ProblemSampler:
    """The run's one drawing order of training prompts (`drmas.tasks.sampler`): the same in every process."""
    return ProblemSampler((task if task is not None else build_task(cfg)).split("train"), cfg.trainer.seed)


def check_drawing_order(cfg: DrmasConfig, out: str | Path, order: ProblemSampler) -> None:
    """Under trainer.resume, refuse (ValueError) a checkpoint in `out` whose run drew in another order: the draws
    it trained would name other prompts. Read before any model is built, so the refusal comes at once."""
    if cfg.trainer.resume:
        state = checkpoint.peek_run_state(out) or {}
        problem = order_change(state.get("order"), order.fingerprint())
        if problem:
            raise ValueError(f"cannot resume {out}: {problem}")


def build_orchestra(cfg: DrmasConfig, task: Task) -> Orchestra:
    """The configured system's orchestra. One that holds resources (the external system: a server and a
    program) has `close()`: a driver calls `close_orchestra` when it is done with it."""
    agents_by_role = {a.role: name for name, a in cfg.agents.items()}
    factory = ORCHESTRAS.get(cfg.system.name)
    extra: dict = {}
    if getattr(factory, "needs_retriever", False):  # the search system: its retriever is built from `retrieval`
        extra["retriever"] = build_retriever(cfg.retrieval, task,
                                             show_progress=process.progress_bars_on(cfg.logging.progress_bar))
        extra["topk"] = cfg.retrieval.topk
    if getattr(factory, "serves_agents", False):  # the external system: its gateway serves every agent by name
        extra["agents"] = {name: a.model for name, a in cfg.agents.items()}
        extra["in_flight"] = (cfg.pipeline.groups_in_flight or cfg.rollout.prompts_per_step) * cfg.rollout.group_size
    return factory(cfg.system, agents_by_role, task, **extra)


def close_orchestra(orchestra: object) -> None:
    """Release what an orchestra holds (see `build_orchestra`); nothing for most."""
    close = getattr(orchestra, "close", None)
    if close is not None:
        close()


def agent_specs(cfg: DrmasConfig, temperature: float | None = None) -> dict[str, AgentSpec]:
    """Sampling parameters per agent: the agent's overrides over the rollout defaults (`temperature`, when
    given, replaces every agent's temperature, as evaluation does), and its role's stop strings followed by its
    own (`agents.<name>.stop`). An agent of a scripted role gets its role's `respond` instead."""
    specs = {}
    for name, a in cfg.agents.items():
        role = role_of(a, cfg)
        if role is not None and role.scripted:
            specs[name] = AgentSpec(model="", sampling=None, script=role(cfg.system).respond)  # type: ignore[attr-defined]
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
        base, adapter = split_model(a.model)
        specs[name] = AgentSpec(model=a.model, sampling=dataclasses.replace(sampling, adapter=adapter or ""),
                                engine=base)
    return specs


def episode_runner(cfg: DrmasConfig, orchestra: Orchestra, engines: Mapping[str, Engine],
                   agents: Mapping[str, AgentSpec], on_round: Callable[[], None] | None = None) -> EpisodeRunner:
    """The episode runner of a driver (colocated loop, rollout, evaluation) with the run's settings: format
    penalty, seed, failure and episode bounds (`rollout.*`)."""
    return EpisodeRunner(orchestra, engines, agents, cfg.algorithm.invalid_penalty, seed=cfg.trainer.seed,
                         on_round=on_round, max_consecutive_failures=cfg.rollout.max_consecutive_episode_failures,
                         bounds=EpisodeBounds.from_config(cfg.rollout))


def build_engine(cfg: DrmasConfig, model_id: str, path: Path, seed: int,
                 adapter_dirs: Mapping[str, Path] | None = None):
    """The configured engine (`rollout.engine`, `rollout.engine_args`) serving `model_id` (a key of `models`)
    from `path`, in the model's compute dtype (the precision its learner computes in, see
    `drmas.models.devices`); with the adapters of it that agents name, each from its directory in
    `adapter_dirs` (a checkpoint's) or as peft initialises it."""
    from drmas.models.devices import build_device
    from drmas.models.loading import compute_dtype

    factory = ENGINES.lookup(cfg.rollout.engine, "rollout.engine")
    mcfg = cfg.models[model_id]
    extra = {}
    if mcfg.adapters:
        extra["adapters"] = adapter_specs(cfg, model_id, adapter_dirs or {})
    return factory(model_id, path, compute_dtype(mcfg, build_device(mcfg.device)), cfg.rollout.max_batch_size, seed,
                   engine_args=dict(cfg.rollout.engine_args), device=mcfg.device, **extra)


def build_engines(cfg: DrmasConfig, seed: int, model_dirs: Mapping[str, Path] | None = None) -> dict[str, Engine]:
    """One engine per model the agents use (`engine_models`), by key of `models`. `model_dirs`: model id ->
    the directory to serve instead of the config's (a checkpoint's model directory, or an adapter's
    `<model>/<adapter>` peft directory)."""
    dirs = dict(model_dirs or {})
    engines: dict[str, Engine] = {}
    try:
        for m in engine_models(cfg):
            adapter_dirs = {a: dirs[f"{m}/{a}"] for a in cfg.models[m].adapters if f"{m}/{a}" in dirs}
            engines[m] = build_engine(cfg, m, dirs.get(m) or model_path(cfg, m), seed, adapter_dirs)
    except BaseException:
        for engine in engines.values():
            if hasattr(engine, "close"):  # a vLLM engine holds its KV cache until shut down
                engine.close()
        raise
    return engines


def weight_target(engines: Mapping[str, Engine], model_id: str):
    """What a push of `model_id` is applied to: its engine (`load_weights`), or for an adapter the
    `AdapterSlot` of its base's engine."""
    base, adapter = split_model(model_id)
    return engines[base] if adapter is None else AdapterSlot(engines[base], adapter)


def adapter_specs(cfg: DrmasConfig, model_id: str, dirs: Mapping[str, Path] | None = None, names=None):
    """The `AdapterSpec`s of `names` (default: those agents name) of model `model_id`, each starting from its
    directory in `dirs` when there is one."""
    from drmas.models.adapters import AdapterSpec
    from drmas.models.loading import torch_dtype

    mcfg = cfg.models[model_id]
    if names is None:
        named = {split_model(a.model)[1] for a in cfg.agents.values() if split_model(a.model)[0] == model_id}
        names = [a for a in mcfg.adapters if a in named]
    return [AdapterSpec.of(a, mcfg.adapters[a], torch_dtype(mcfg.dtype), (dirs or {}).get(a)) for a in names]


def model_path(cfg: DrmasConfig, model_id: str) -> Path:
    """The directory of `model_id` (an adapter's: its base's)."""
    base = split_model(model_id)[0]
    return resolve_model_path(cfg.models[base], where=f"models.{base}")
