"""The trainers a learner builds: a model's `PolicyTrainer`, or one per LoRA adapter over one shared frozen base.

Here, not in `drmas.assembly`, which builds what every process needs from the config (engines, orchestras,
tasks) and sits below the learner: the training side is the learner's own."""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from drmas import assembly
from drmas.config.schema import DrmasConfig
from drmas.learner.allocator import jemalloc_loaded
from drmas.learner.heap import huge_pages_in_effect, map_large_blocks
from drmas.learner.policy import PolicyTrainer

log = logging.getLogger(__name__)


def trained_policy(cfg: DrmasConfig, model_id: str, ranks, device: torch.device):
    """(PolicyTrainer, tokenizer) of `model_id` on `device`, over `ranks` (every learner rank builds one): what
    `learner_trainers` builds for this one model id."""
    (trainer,), tokenizer = learner_trainers(cfg, [model_id], ranks, device)
    return trainer, tokenizer


def learner_trainers(cfg: DrmasConfig, ids: Sequence[str], ranks, device: torch.device):
    """`(trainers, tokenizer)` of a learner process training the model ids `ids` (`drmas.config.derived
    .learner_processes`): one model's, or one per adapter of one base over one shared copy of it, frozen in
    the compute dtype (`adapter_trainers`). First sets this process's heap up for training
    (`drmas.learner.heap`, unless jemalloc serves it: `drmas.learner.allocator`)."""
    from drmas.models.loading import compute_dtype, load_model, torch_dtype

    (base,) = {assembly.split_model(m)[0] for m in ids}
    if jemalloc_loaded():  # preloaded by `drmas-learner` at its start (drmas.learner.allocator)
        log.info("malloc: jemalloc")
    else:
        map_large_blocks(cfg.models[base].heap_mmap_threshold_kb)
    if cfg.models[base].huge_pages:  # asked for by `drmas-learner` at its start (`advise_huge_pages`)
        log.info("huge pages for tensors of 2 MiB or more: %s", "yes" if huge_pages_in_effect() else
                 "no (this process allocated tensors before drmas.learner.heap.advise_huge_pages)")
    if cfg.models[base].adapters:
        return adapter_trainers(cfg, ids, device, ranks)
    (model_id,) = ids
    mcfg = cfg.models[model_id]
    model, tokenizer = load_model(assembly.model_path(cfg, model_id), dtype=mcfg.dtype, device=device)
    weights = {a: cfg.agents[a].loss_weight for a in assembly.trained_agents(cfg, model_id)}
    return [PolicyTrainer(model_id, model, mcfg.optim, cfg.algorithm, weights, ranks=ranks,
                          compute_dtype=torch_dtype(compute_dtype(mcfg, device)),
                          activation_checkpointing=mcfg.activation_checkpointing)], tokenizer


def adapter_trainers(cfg: DrmasConfig, ids: Sequence[str], device, ranks=None):
    """`(trainers, tokenizer)`: a `PolicyTrainer` per adapter model id (all adapters of one model), over one
    shared copy of the base, frozen in the compute dtype on `device` (a learner process, and the colocated
    loop: every trained adapter of the model it trains; a learner per adapter: one)."""
    from drmas.models.adapters import attach_adapters
    from drmas.models.loading import compute_dtype, load_model, torch_dtype

    (base,) = {assembly.split_model(m)[0] for m in ids}  # one base model
    mcfg = cfg.models[base]
    dtype = compute_dtype(mcfg, device)
    model, tokenizer = load_model(assembly.model_path(cfg, base), dtype=dtype, device=device, key=f"models.{base}")
    names = [assembly.split_model(m)[1] for m in ids]
    specs = assembly.adapter_specs(cfg, base, names=names)
    model = attach_adapters(model, specs, trainable=True, seed=cfg.trainer.seed, where=f"models.{base}.adapters")
    trainers = [PolicyTrainer(m, model, assembly.optim_config(cfg, m), cfg.algorithm,
                              {a: cfg.agents[a].loss_weight for a in assembly.trained_agents(cfg, m)}, ranks=ranks,
                              compute_dtype=torch_dtype(dtype), adapter=name, export_merged=mcfg.export_merged,
                              activation_checkpointing=mcfg.activation_checkpointing)
                for m, name in zip(ids, names)]
    return trainers, tokenizer
