"""How a model's learner is spread over processes: the interface `PolicyTrainer` updates through, and its
one-process backend.

`PolicyTrainer.update` is written once, for any number of ranks. Every rank is handed the same global
batch; each trains on its share of every optimizer step's samples, and what has to agree across ranks goes
through the few methods below: the loss normaliser is the global step's token (or sequence) count, so the
gradients summed over ranks are exactly the gradient of the one-process loss; the step's loss and
statistics are sums over ranks; the clipping norm is the global one. With one rank (`SingleRank`) every
method is the identity and no process group exists. The sharded backend (`drmas.learner.ranks.sharding`) is its
sibling, behind the same methods.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from drmas.weights.learner.source import LiveParameters, WeightSource


class SingleRank:
    """The whole model in this process; nothing to share, reduce or gather."""

    rank = 0
    size = 1

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as this backend trains it (sharded backends wrap it; here: unchanged)."""
        return model

    def share(self, indices: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
        """This rank's part of `indices` (global sample indices of one pass); `lengths` are every sample's
        token counts, so that backends can balance tokens. Here: all of them."""
        return indices

    def missing_passes(self, passes: int) -> int:
        """How many idle forward passes this rank must add to its `passes` so that every rank runs as many
        (sharded forwards are collectives). Called before the passes. Here: none."""
        return 0

    def idle_passes(self, model: torch.nn.Module, count: int, backward: bool) -> None:
        """Run `count` forward (and backward) passes that change no gradient (see `missing_passes`)."""

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over ranks."""
        return [float(v) for v in values]

    def max(self, values: Sequence[float]) -> list[float]:
        """Each value's maximum over ranks."""
        return [float(v) for v in values]

    def fill_rows(self, rows: list[torch.Tensor | None], lengths: Sequence[int]) -> list[torch.Tensor]:
        """Every rank's rows: `rows[i]` is set on exactly the rank that computed it (length `lengths[i]`);
        afterwards every rank holds all of them. Here they are all set already."""
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            raise ValueError(f"rows {missing[:5]} were never computed")
        return rows  # type: ignore[return-value]

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        """Clip the gradients to `max_norm` by their global norm; returns that norm (before clipping)."""
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def full_tensors(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter whole, by name, as an engine's `load_weights` takes them."""
        for name, param in model.named_parameters():
            yield name, param.detach()

    def weight_source(self, model: torch.nn.Module, before_pass: Callable[[], None] | None = None) -> WeightSource:
        """The whole weights as pushes, join syncs and HF checkpoints read them (`drmas.weights.learner.source`):
        here the live parameters, no gather and no copy. ``before_pass`` (sharded backends: rank 0's order
        to the other ranks to join a gather) is never needed here."""
        return LiveParameters(model)

    def saveable(self, model: torch.nn.Module, source: WeightSource):
        """What `save_pretrained` writes as a plain HF directory holding `source`'s weights (here: the model)."""
        return model
