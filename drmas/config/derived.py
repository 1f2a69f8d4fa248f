"""Facts every process derives from a config alike: which agents train which model, which models get a learner.

The buffer queues, the learners pull, the rollouts send and the launchers start processes by these, so they
are computed once, here, from the settings alone.

A *model id* of the pipeline is a key of `models`, or `<model>/<adapter>` for one LoRA adapter of a model
(`models.<model>.adapters`). Each such id is what agents name, what samples are stamped with, what the buffer
admits by and what one learner trains, with a version of its own: an adapter is a model of the pipeline whose
weights are its adapter tensors. Engines are built per key of `models` (`engine_models`): one engine holds
a base once and serves all its adapters.
"""

from __future__ import annotations

from drmas.config.schema import DrmasConfig, ModelConfig, OptimConfig

ADAPTER_SEP = "/"


def split_model(model_id: str) -> tuple[str, str | None]:
    """(key of `models`, adapter name or None) of a model id: `base/solver` -> ('base', 'solver')."""
    base, sep, adapter = model_id.partition(ADAPTER_SEP)
    return (base, adapter) if sep else (base, None)


def model_ids(cfg: DrmasConfig) -> list[str]:
    """Every model id of the pipeline, in the order of `models`: a model, or each of its adapters instead.
    A learner's default port is `pipeline.learner_base_port` + its position here."""
    return [mid for m, mcfg in cfg.models.items()
            for mid in ([f"{m}{ADAPTER_SEP}{a}" for a in mcfg.adapters] if mcfg.adapters else [m])]


def model_config(cfg: DrmasConfig, model_id: str) -> ModelConfig:
    """The `models` section of a model id (an adapter's: its base's)."""
    return cfg.models[split_model(model_id)[0]]


def optim_config(cfg: DrmasConfig, model_id: str) -> OptimConfig:
    """The optimizer settings of a model id: an adapter's own `optim`, else its model's."""
    base, adapter = split_model(model_id)
    mcfg = cfg.models[base]
    own = mcfg.adapters[adapter].optim if adapter is not None else None
    return own if own is not None else mcfg.optim


def engine_models(cfg: DrmasConfig) -> list[str]:
    """Keys of `models` the agents use, in the order of `models`: one engine each."""
    used = {split_model(a.model)[0] for a in cfg.agents.values() if a.model}
    return [m for m in cfg.models if m in used]


def trained_agents(cfg: DrmasConfig, model_id: str) -> list[str]:
    """Agents whose samples train `model_id`."""
    return [n for n, a in cfg.agents.items() if a.model == model_id and a.trainable]


def trained_models(cfg: DrmasConfig) -> list[str]:
    """Model ids that get a learner: trainable and trained by at least one agent (in the order of `model_ids`)."""
    return [m for m in model_ids(cfg) if model_config(cfg, m).trainable and trained_agents(cfg, m)]


def learner_processes(cfg: DrmasConfig) -> dict[str, list[str]]:
    """The learner processes of the run: process id -> the model ids it trains, in the order of
    `trained_models`. A trained model is a process of its own (its id: the model id); so is each adapter
    of a model with `learner_per_adapter`; otherwise the trained adapters of one model share one process over
    one copy of the base, whose id is the model's key (`drmas-learner --model <key>`)."""
    processes: dict[str, list[str]] = {}
    for m in trained_models(cfg):
        base, adapter = split_model(m)
        shared = adapter is not None and not cfg.models[base].learner_per_adapter
        processes.setdefault(base if shared else m, []).append(m)
    return processes


def learner_process_of(cfg: DrmasConfig, model_id: str) -> str:
    """The id of the learner process that trains `model_id` (see `learner_processes`)."""
    for process, ids in learner_processes(cfg).items():
        if model_id in ids:
            return process
    raise KeyError(f"{model_id!r} is not a trained model ({', '.join(trained_models(cfg)) or 'none'})")


def trained_agent_models(cfg: DrmasConfig) -> dict[str, str]:
    """Agent -> model id for every agent whose samples train a model: what the buffer queues and learners pull."""
    return {a: m for m in trained_models(cfg) for a in trained_agents(cfg, m)}
