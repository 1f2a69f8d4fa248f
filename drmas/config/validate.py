"""Semantic checks of a resolved config: the values each make sense and fit together.

Type errors are caught by OmegaConf against the schema; this module catches what types cannot express
(ranges, choices, references between sections) and names the key in every message. The sections of their
own module check themselves (`Section.problems`), the chosen system's and task's settings among them. Names that select a registered component (system, task,
engine, launcher, retriever) are not checked here: a plugin may register them, so they are checked where
components are built (`drmas.assembly.check_components`), still before any process starts.
"""

from __future__ import annotations

from drmas.config.derived import ADAPTER_SEP, learner_processes, model_config, model_ids, split_model
from drmas.config.errors import ConfigError
from drmas.config.gpus import check_plan
from drmas.config.schema import (
    ADAPTER_NAME,
    AGGREGATIONS,
    ALLOCATORS,
    BUILTIN_MODELS,
    DEVICE_SPEC,
    DTYPES,
    HEAP_MMAP_THRESHOLD_MAX_KB,
    PIPELINE_MODES,
    DrmasConfig,
    ModelConfig,
    OptimConfig,
)


def validate_config(cfg: DrmasConfig) -> None:
    """Raise ConfigError on the first impossible value or broken reference."""
    errors: list[str] = []
    _check_models(cfg, errors)
    _check_agents(cfg, errors)
    _check_algorithm(cfg, errors)
    _check_rollout_and_trainer(cfg, errors)
    _check_pipeline(cfg, errors)
    _check_retrieval(cfg, errors)
    errors.extend(cfg.system.all_problems("system"))  # the chosen system's and task's own settings, and the
    errors.extend(cfg.task.all_problems("task"))  # sections nested in them (a plugin's `system.sandbox`)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))


def _check_models(cfg: DrmasConfig, errors: list[str]) -> None:
    if not cfg.models:
        errors.append("models: at least one model is required")
    for mid, m in cfg.models.items():
        where = f"models.{mid}"
        if ADAPTER_SEP in mid:
            errors.append(f"{where}: a model id may not contain {ADAPTER_SEP!r} (agents name an adapter as "
                          f"<model>{ADAPTER_SEP}<adapter>)")
        if m.path is None and m.builtin is None:  # both set is fine: `path` wins (overriding a shipped builtin)
            errors.append(f"{where}: set 'path' (a local model directory or a model id in the local HF cache) "
                          "or 'builtin'")
        if m.builtin is not None and m.builtin not in BUILTIN_MODELS:
            errors.append(f"{where}.builtin: {m.builtin!r} is not one of {', '.join(BUILTIN_MODELS)}")
        if not DEVICE_SPEC.match(m.device):
            errors.append(f"{where}.device: {m.device!r} is not a device (auto, cpu, cuda or cuda:N)")
        if m.dtype not in DTYPES:
            errors.append(f"{where}.dtype: {m.dtype!r} is not one of {', '.join(DTYPES)}")
        if m.compute_dtype is not None and m.compute_dtype not in DTYPES:
            errors.append(f"{where}.compute_dtype: {m.compute_dtype!r} is not one of {', '.join(DTYPES)}")
        elif m.compute_dtype not in (None, m.dtype) and m.dtype != "float32":
            errors.append(f"{where}.compute_dtype: {m.compute_dtype} with dtype {m.dtype}: a learner computes in its "
                          "parameters' dtype or a narrower one (set compute_dtype to the dtype, or dtype float32)")
        if m.collective_timeout_s <= 0:
            errors.append(f"{where}.collective_timeout_s: must be > 0, got {m.collective_timeout_s}")
        if m.allocator not in ALLOCATORS:
            errors.append(f"{where}.allocator: must be one of {', '.join(ALLOCATORS)}, got {m.allocator!r}")
        if not 0 <= m.heap_mmap_threshold_kb <= HEAP_MMAP_THRESHOLD_MAX_KB:
            errors.append(f"{where}.heap_mmap_threshold_kb: must be in [0, {HEAP_MMAP_THRESHOLD_MAX_KB}], got "
                          f"{m.heap_mmap_threshold_kb}")
        if m.ranks < 1:
            errors.append(f"{where}.ranks: must be >= 1, got {m.ranks}")
        elif m.ranks > 1 and cfg.pipeline.mode != "async":
            errors.append(f"{where}.ranks={m.ranks}: learner ranks need pipeline.mode=async (the {cfg.pipeline.mode} "
                          "loop trains in one process)")
        elif m.ranks > 1 and DEVICE_SPEC.match(m.device) and ":" in m.device:
            errors.append(f"{where}.ranks={m.ranks}: device {m.device} names one GPU; N ranks take the first N "
                          "visible ones (device cuda or auto)")
        _check_optim(f"{where}.optim", m.optim, errors)
        _check_adapters(cfg, where, m, errors)
        if m.tiny.hidden_size % max(m.tiny.num_heads, 1) or m.tiny.hidden_size // max(m.tiny.num_heads, 1) < 32:
            errors.append(f"{where}.tiny: hidden_size / num_heads must be an integer >= 32")


def _check_optim(where: str, optim: OptimConfig, errors: list[str]) -> None:
    if optim.lr < 0:
        errors.append(f"{where}.lr: must be >= 0, got {optim.lr}")
    if optim.warmup_steps < 0:
        errors.append(f"{where}.warmup_steps: must be >= 0, got {optim.warmup_steps}")


def _check_adapters(cfg: DrmasConfig, where: str, m: ModelConfig, errors: list[str]) -> None:
    """The LoRA adapters of one model (docs/lora.md)."""
    if not m.adapters:
        if m.export_merged:
            errors.append(f"{where}.export_merged: merges adapters into the model, and it has none "
                          f"({where}.adapters)")
        if m.learner_per_adapter:
            errors.append(f"{where}.learner_per_adapter: lays out the learners of adapters, and it has none "
                          f"({where}.adapters)")
        return
    if m.ranks > 1:
        errors.append(f"{where}.ranks={m.ranks}: a model with adapters trains them in one learner process of one "
                      "rank (holding the frozen base once); set ranks 1")
    for name, a in m.adapters.items():
        key = f"{where}.adapters.{name}"
        if not ADAPTER_NAME.match(name):
            errors.append(f"{key}: adapter names are letters, digits and '_', starting with a letter")
        if a.rank < 1:
            errors.append(f"{key}.rank: must be >= 1, got {a.rank}")
        if not a.alpha > 0:
            errors.append(f"{key}.alpha: must be > 0, got {a.alpha}")
        if not 0 <= a.dropout < 1:
            errors.append(f"{key}.dropout: must be in [0, 1), got {a.dropout}")
        if not a.target_modules or not all(isinstance(t, str) and t.strip() for t in a.target_modules):
            errors.append(f"{key}.target_modules: a non-empty list of module names, got {a.target_modules!r}")
        if a.optim is not None:
            _check_optim(f"{key}.optim", a.optim, errors)


def _check_agents(cfg: DrmasConfig, errors: list[str]) -> None:
    if not cfg.agents:
        errors.append("agents: at least one agent is required")
    for name, a in cfg.agents.items():
        where = f"agents.{name}"
        if a.model:  # none at all: a scripted role's agent (drmas.assembly checks)
            _check_model_ref(cfg, f"{where}.model", a.model, errors)
        if not a.role:
            errors.append(f"{where}.role: required")
        if a.temperature is not None and a.temperature < 0:
            errors.append(f"{where}.temperature: must be >= 0")
        if a.top_p is not None and not 0 < a.top_p <= 1:
            errors.append(f"{where}.top_p: must be in (0, 1]")
        if a.max_new_tokens is not None and a.max_new_tokens < 1:
            errors.append(f"{where}.max_new_tokens: must be >= 1")
        if not all(isinstance(stop, str) and stop for stop in a.stop):
            errors.append(f"{where}.stop: stop strings must be non-empty, got {a.stop!r}")
    roles = [a.role for a in cfg.agents.values()]
    for role in set(roles):
        if roles.count(role) > 1:
            errors.append(f"agents: role {role!r} is played by more than one agent")


def _check_model_ref(cfg: DrmasConfig, key: str, model_id: str, errors: list[str]) -> None:
    """An agent's model: a key of `models`, or `<model>/<adapter>` of one of its adapters."""
    base, adapter = split_model(model_id)
    if base not in cfg.models:
        errors.append(f"{key}: {base!r} is not a key of 'models' ({', '.join(cfg.models) or 'none'})")
        return
    adapters = cfg.models[base].adapters
    if adapter is None and adapters:
        errors.append(f"{key}: models.{base} has adapters, and its base is frozen: name one of them "
                      f"({', '.join(f'{base}{ADAPTER_SEP}{a}' for a in adapters)})")
    elif adapter is not None and adapter not in adapters:
        errors.append(f"{key}: {adapter!r} is not an adapter of models.{base} (models.{base}.adapters: "
                      f"{', '.join(adapters) or 'none'})")


def _check_algorithm(cfg: DrmasConfig, errors: list[str]) -> None:
    alg = cfg.algorithm
    if alg.normalization is not None and alg.estimator not in ("agent", alg.normalization):
        errors.append(f"algorithm.normalization: deprecated, and it says {alg.normalization!r} where "
                      f"algorithm.estimator says {alg.estimator!r}; set only algorithm.estimator")
    if alg.aggregation not in AGGREGATIONS:
        errors.append(f"algorithm.aggregation: {alg.aggregation!r} is not one of {', '.join(AGGREGATIONS)}")
    if not 0 <= alg.clip_low < 1:
        errors.append(f"algorithm.clip_low: must be in [0, 1), got {alg.clip_low}")
    if alg.clip_high < 0:
        errors.append(f"algorithm.clip_high: must be >= 0, got {alg.clip_high}")
    if alg.dual_clip is not None and alg.dual_clip <= 1:
        errors.append(f"algorithm.dual_clip: must be > 1 (or null), got {alg.dual_clip}")
    if alg.max_is_weight is not None and alg.max_is_weight <= 0:
        errors.append(f"algorithm.max_is_weight: must be > 0 (or null), got {alg.max_is_weight}")
    if alg.eps <= 0:
        errors.append(f"algorithm.eps: must be > 0, got {alg.eps}")
    if alg.optim_steps_per_update < 1:
        errors.append("algorithm.optim_steps_per_update: must be >= 1")
    if alg.micro_batch_size < 1:
        errors.append("algorithm.micro_batch_size: must be >= 1")
    if alg.running_stats_window < 0:
        errors.append("algorithm.running_stats_window: must be >= 0")
    if alg.singleton_clip is not None and not alg.singleton_clip > 0:
        errors.append(f"algorithm.singleton_clip: must be > 0 (or null), got {alg.singleton_clip}")


def _check_rollout_and_trainer(cfg: DrmasConfig, errors: list[str]) -> None:
    r, t = cfg.rollout, cfg.trainer
    for key in ("group_size", "prompts_per_step", "max_new_tokens", "max_batch_size",
                "max_consecutive_episode_failures", "max_episode_turns", "max_episode_tool_calls",
                "max_stuck_plugin_calls"):
        if getattr(r, key) < 1:
            errors.append(f"rollout.{key}: must be >= 1, got {getattr(r, key)}")
    if not r.episode_timeout_s > 0:
        errors.append(f"rollout.episode_timeout_s: must be > 0 (seconds), got {r.episode_timeout_s}")
    if not r.plugin_call_timeout_s >= 0:
        errors.append(f"rollout.plugin_call_timeout_s: must be >= 0 (seconds; 0: plugin code in the driver's "
                      f"thread, unbounded), got {r.plugin_call_timeout_s}")
    own = getattr(cfg.system, "episode_timeout_s", None)  # a system's own bound (the gateway's) must bite first
    if isinstance(own, (int, float)) and own >= r.episode_timeout_s:
        errors.append(f"rollout.episode_timeout_s: {r.episode_timeout_s:g} s must exceed system.episode_timeout_s "
                      f"({own:g} s), the system's own bound, which reports why its episode did not end")
    if r.temperature < 0:
        errors.append("rollout.temperature: must be >= 0")
    if not 0 < r.top_p <= 1:
        errors.append("rollout.top_p: must be in (0, 1]")
    if t.steps < 0:
        errors.append("trainer.steps: must be >= 0")
    if t.checkpoint_interval < 0:
        errors.append("trainer.checkpoint_interval: must be >= 0")
    if t.keep_checkpoints < 0:
        errors.append(f"trainer.keep_checkpoints: must be >= 0 (0: keep every checkpoint), got {t.keep_checkpoints}")
    if cfg.eval.n_problems < 0:
        errors.append("eval.n_problems: must be >= 0")


def _check_pipeline(cfg: DrmasConfig, errors: list[str]) -> None:
    p = cfg.pipeline
    if p.mode not in PIPELINE_MODES:
        errors.append(f"pipeline.mode: {p.mode!r} is not one of {', '.join(PIPELINE_MODES)}")
    if p.launcher != "local" and p.mode != "async":
        errors.append(f"pipeline.launcher={p.launcher}: launchers start the async pipeline's processes; set "
                      f"pipeline.mode=async (got {p.mode!r})")
    errors.extend(p.ray.problems("pipeline.ray"))
    learners = {process: model_config(cfg, process) for process in learner_processes(cfg)}
    errors.extend(check_plan(p.gpus, {m: c.ranks for m, c in learners.items()},
                             {m: c.device for m, c in learners.items()}, p.launcher))
    for key, low in (("max_staleness", 0), ("num_rollouts", 1), ("groups_in_flight", 0)):
        if getattr(p, key) < low:
            errors.append(f"pipeline.{key}: must be >= {low}, got {getattr(p, key)}")
    if p.report_interval_s <= 0:
        errors.append(f"pipeline.report_interval_s: must be > 0, got {p.report_interval_s}")
    errors.extend(p.buffer.problems("pipeline.buffer"))
    errors.extend(p.weights.problems("pipeline.weights"))
    errors.extend(p.restarts.problems("pipeline.restarts"))
    ids = model_ids(cfg)
    for model in p.learner_ports:
        if model not in ids:
            errors.append(f"pipeline.learner_ports.{model}: not a model id ({', '.join(ids)}; a model with adapters "
                          "has a port per adapter: <model>/<adapter>)")
    for model in p.learner_hosts:  # a model with adapters: the host of all its adapters' learners
        if model not in ids and model not in cfg.models:
            errors.append(f"pipeline.learner_hosts.{model}: not a model id ({', '.join(ids)})")
    for model, port in p.learner_ports.items():
        if not 0 <= port <= 65535:
            errors.append(f"pipeline.learner_ports.{model}: {port} is not a TCP port (0 = assigned by `drmas run`)")
    if not 0 <= p.learner_base_port <= 65535 - len(ids):
        errors.append(f"pipeline.learner_base_port: {p.learner_base_port} leaves no room for {len(ids)} ports")


def _check_retrieval(cfg: DrmasConfig, errors: list[str]) -> None:
    errors.extend(cfg.retrieval.problems("retrieval"))
    e = cfg.eval
    if e.k < 1:
        errors.append(f"eval.k: must be >= 1, got {e.k}")
    if e.max_questions < 0:
        errors.append(f"eval.max_questions: must be >= 0 (0 = all), got {e.max_questions}")
    if not 0 < e.k_top_p <= 1:
        errors.append(f"eval.k_top_p: must be in (0, 1], got {e.k_top_p}")
    if e.k_temperature < 0:
        errors.append(f"eval.k_temperature: must be >= 0, got {e.k_temperature}")
    if e.interval < 0:
        errors.append(f"eval.interval: must be >= 0 (0: no evaluation during training), got {e.interval}")
