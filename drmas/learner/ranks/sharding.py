"""A model's learner as N data-parallel ranks, the model sharded with PyTorch FSDP2 (`fully_shard`).

Why FSDP2: weights, gradients and AdamW state of a 7B model in float32 are ~110 GB, more than one GPU holds;
sharded over N ranks each holds 1/N of them and gathers one decoder layer's weights at a time for its
passes. Each decoder layer is its own FSDP unit (then the root: embeddings, final norm, head), so at most
one layer is gathered beyond the shards. On CUDA the passes run in bfloat16 and gradients are reduced in
float32 (`MixedPrecisionPolicy`); on CPU nothing is cast, which is what makes a 2-rank update on CPU
reproduce the 1-rank update to float32 rounding (tests/test_sharding.py).

Data parallelism, and why the normalisation is exact. Every rank holds the whole global batch (samples
are small next to the model) and trains on its share of each optimizer step: samples, not whole groups,
because the advantages are computed from the whole groups before the update, after which each sample's
loss stands alone; dealing samples by length balances the ranks' tokens, which groups of mixed lengths
would not. Each rank scales its micro-batch losses by the *global* step's token count (or sequence count),
so the sum of the ranks' gradients is the gradient of the one-process token-mean: not a mean of rank
means, which would weigh a token of a short share more. FSDP2 averages gradients over ranks by default;
here its reduction is switched to a plain sum (`set_gradient_divide_factor(1.0)` with sum-only
collectives, because gloo has no pre-multiplied sum). The clipping norm is computed over the sharded
gradients (DTensors), i.e. globally, and every rank sees the same value, so every rank takes or skips a
non-finite step alike.

Sharded forwards and backwards are collectives (a layer's weights are all-gathered, its gradients
reduce-scattered), so every rank must run as many passes. A rank with fewer micro-batches than another
(uneven shares, or no samples at all) runs idle passes on one token whose loss is multiplied by zero:
they add nothing to any gradient. The number of passes is agreed *before* the passes, because any other
collective issued between them would pair with a peer's all-gather.
"""

from __future__ import annotations

import datetime
import os
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from drmas.config.schema import ModelConfig
from drmas.learner.ranks.gathered import GatheredWeights, whole
from drmas.learner.ranks.single import SingleRank
from drmas.models.hf_streamed import StreamedPretrained
from drmas.weights.learner.source import WeightSource

COLLECTIVE_TIMEOUT_S = ModelConfig.collective_timeout_s  # a dead peer rank surfaces as an error after it


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules to shard one by one: those of the classes the model names unsplittable (its decoder
    layers, e.g. `Qwen2DecoderLayer`); falls back to `model.model.layers`."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        layers = list(getattr(getattr(model, "model", None), "layers", None) or ())
    if not layers:
        raise ValueError(f"{type(model).__name__}: found no decoder layers to shard")
    return layers


def shard_model(model: torch.nn.Module, device: torch.device, size: int) -> torch.nn.Module:
    """`model` (already on `device`) sharded in place over the `size` ranks of the default process group."""
    mesh = init_device_mesh(device.type, (size,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if device.type == "cuda" else MixedPrecisionPolicy())
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # sum the ranks' gradients: each is already globally normalised
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(1.0)
    return model


def deal(indices: np.ndarray, lengths: Sequence[int], rank: int, size: int) -> np.ndarray:
    """`rank`'s share of `indices`: dealt by length in snake order (longest to rank 0, 1, ..., N-1, then
    N-1, ..., 0, ...), so the ranks' token counts stay close; the same answer on every rank, ascending."""
    by_length = sorted((int(i) for i in indices), key=lambda i: (-lengths[i], i))
    mine = [i for pos, i in enumerate(by_length)
            if (pos % size if (pos // size) % 2 == 0 else size - 1 - pos % size) == rank]
    return np.array(sorted(mine), dtype=np.int64)


def init_ranks(device_type: str, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """Join the default process group from the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT). On CUDA, NCCL carries the model's collectives and gloo the small CPU ones."""
    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


class ShardedRanks(SingleRank):
    """This process is one of the default process group's ranks, all training the same model together."""

    def __init__(self, device: torch.device) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ShardedRanks needs the process group (init_ranks) first")
        self.device = device
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return shard_model(model, self.device, self.size)

    def share(self, indices: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
        return deal(indices, lengths, self.rank, self.size)

    def missing_passes(self, passes: int) -> int:
        return int(self.max([passes])[0]) - passes

    def idle_passes(self, model: torch.nn.Module, count: int, backward: bool) -> None:
        token = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        for _ in range(count):
            with torch.set_grad_enabled(backward):
                logits = model(input_ids=token, use_cache=False).logits
                if backward:
                    (logits.float().sum() * 0.0).backward()

    def sum(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: Sequence[float], op) -> list[float]:
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def fill_rows(self, rows: list[torch.Tensor | None], lengths: Sequence[int]) -> list[torch.Tensor]:
        """One all-reduce of a flat buffer in which each rank wrote its own rows (zeros elsewhere): adding
        zeros is exact, so every rank ends with bit-identical copies."""
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        flat = torch.zeros(int(offsets[-1]), dtype=torch.float32)
        for i, row in enumerate(rows):
            if row is not None:
                flat[offsets[i] : offsets[i + 1]] = row.detach().float().cpu()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        device = next((r.device for r in rows if r is not None), torch.device("cpu"))
        return list(torch.split(flat.to(device), list(lengths)))

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # over DTensors: reduced across the shards
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)

    def full_tensors(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """Whole parameters, one all-gather each (a collective: every rank must iterate to the end)."""
        for name, param in model.named_parameters():
            yield name, whole(param)

    def weight_source(self, model: torch.nn.Module, before_pass: Callable[[], None] | None = None) -> WeightSource:
        """The whole weights gathered one parameter at a time as they are read (`drmas.learner.ranks.gathered`);
        rank 0 passes ``before_pass`` to order the other ranks into each pass."""
        return GatheredWeights(model, before_pass)

    def saveable(self, model: torch.nn.Module, source: WeightSource):
        """The model's HF directory written streamed from `source` (`drmas.models.hf_streamed`): saving the sharded
        model itself would gather the whole state dict on one rank."""
        return StreamedPretrained(model, source)
