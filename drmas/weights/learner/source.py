"""Where a transfer's tensors come from: a weight source announces the layout, then streams one pass.

Why not a list of named tensors: a learner whose model is sharded over N ranks does not hold its weights
whole anywhere. Gathering them all before a push would put one whole copy of the model on one rank beside
its shard (for a 7B model in float32, 28 GB), the very thing sharding avoids. So a transfer asks its source
for two things:

- `specs()`: every tensor's name, shape and dtype, from metadata (for sharded weights: the parameters'
  global shapes), so the layout is announced to the rollouts before any gather;
- `open()`: one *pass*, a context manager giving a sequence whose item ``i`` is the tensor of ``specs()[i]``.
  A transfer reads the items in ascending order and never goes back, so a source may produce each tensor
  when it is asked for and release it once a later one is asked for (see `drmas.learner.ranks.gathered`). A
  transfer that must send the data again (a relay chain that broke mid-push resends to the rollouts behind
  the break) opens another pass.

`concurrent` says whether a pass may run on any thread while the source's owner goes on with its own work:
true for tensors in memory; false for a gather, which is a collective with other processes and would
interleave with the owner's training collectives (the sender then serves join syncs when the owner asks,
see `WeightSender.serve_joins`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, Protocol, Sequence, Union, runtime_checkable

import msgspec
import torch

from drmas.weights.chunks import TensorSpec, dtype_from_name, dtype_name, tensor_specs


@runtime_checkable
class WeightSource(Protocol):
    """What a transfer reads (see the module docstring)."""

    concurrent: bool
    peak_bytes: int  # the largest total of gathered bytes alive at once during the last pass (0: none gathered)

    def specs(self) -> list[TensorSpec]:
        """Name, shape, dtype (and alias) of every tensor, in the order a pass yields them."""
        ...

    def open(self):
        """A context manager for one pass: a sequence of tensors (None for aliases), read in ascending order."""
        ...


class NamedTensors:
    """Tensors in memory (a list of `(name, tensor)`): every pass yields the same tensors, no copy."""

    concurrent = True
    peak_bytes = 0  # nothing is gathered: the tensors are there already

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        self._named = list(named)

    def named(self) -> list[tuple[str, torch.Tensor]]:
        return self._named

    def specs(self) -> list[TensorSpec]:
        return tensor_specs(self.named())

    @contextmanager
    def open(self) -> Iterator[list[torch.Tensor | None]]:
        named = self.named()
        yield [None if spec.alias_of >= 0 else tensor for spec, (_, tensor) in zip(tensor_specs(named), named)]


class LiveParameters(NamedTensors):
    """A model's parameters themselves (one process holds the whole model): listed afresh for every pass,
    never copied. The owner changes them in place only while no transfer runs (`WeightSender.exclusive`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__([])
        self._model = model

    def named(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, param.detach()) for name, param in self._model.named_parameters()]


class CastSource:
    """Another source's floating-point tensors in `dtype` (the engines' compute dtype, see `drmas.models.devices`):
    a push of float32 master weights to bfloat16 engines sends half the bytes, and the engines receive what
    they hold. Each tensor is cast as a pass reads it (one at a time, never a whole copy); tensors already
    in `dtype` and non-floating ones pass as they are."""

    def __init__(self, source: WeightSource, dtype: torch.dtype) -> None:
        self.source, self.dtype = source, dtype
        self.concurrent = source.concurrent

    @property
    def peak_bytes(self) -> int:
        return self.source.peak_bytes

    def specs(self) -> list[TensorSpec]:
        name = dtype_name(self.dtype)
        return [msgspec.structs.replace(spec, dtype=name) if dtype_from_name(spec.dtype).is_floating_point else spec
                for spec in self.source.specs()]

    @contextmanager
    def open(self) -> Iterator[Sequence[torch.Tensor | None]]:
        with self.source.open() as tensors:
            yield _Cast(tensors, self.dtype)


class _Cast(Sequence):
    """A pass's tensors, cast when read (the last one kept: a large tensor is read once per slice)."""

    def __init__(self, tensors: Sequence[torch.Tensor | None], dtype: torch.dtype) -> None:
        self._tensors, self._dtype = tensors, dtype
        self._last: tuple[int, torch.Tensor | None] | None = None

    def __len__(self) -> int:
        return len(self._tensors)

    def __getitem__(self, index):  # type: ignore[override]
        if self._last is None or self._last[0] != index:
            tensor = self._tensors[index]
            if tensor is not None and tensor.is_floating_point():
                tensor = tensor.to(self._dtype)
            self._last = (index, tensor)
        return self._last[1]


Weights = Union[WeightSource, Iterable[tuple[str, torch.Tensor]]]
"""What `WeightSender.push` and a ``current_weights`` provider accept: a source, or named tensors."""


def as_source(weights: Weights, dtype: torch.dtype | None = None) -> WeightSource:
    """``weights`` as a source (named tensors are wrapped in `NamedTensors`), its floating-point tensors in
    ``dtype`` when given (`CastSource`)."""
    source = weights if isinstance(weights, WeightSource) else NamedTensors(list(weights))
    return source if dtype is None else CastSource(source, dtype)
