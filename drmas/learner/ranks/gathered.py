"""The whole weights of a sharded learner, gathered one parameter at a time as a transfer or a checkpoint
reads them: a `WeightSource` (see `drmas.weights.learner.source`) that never holds the whole model.

Why streamed: each rank of an FSDP2 learner holds 1/N of every parameter. A push, a join sync and the
Hugging Face checkpoint need every parameter whole, on rank 0; gathering them all first would put one whole
float32 copy of the model on rank 0 beside its shard (28 GB for a 7B model). Instead a pass all-gathers
parameter i when the reader asks for item i, and lets go of parameter i-1 then: rank 0's extra memory is
the parameter being read plus those still on the wire (a transfer keeps at most two units in flight), so
about the largest parameter or two (the embedding, or an MLP matrix), never the model.

- **Layout from metadata.** `specs()` reads each parameter's global shape and dtype from its DTensor, so
  the layout a transfer announces needs no gather.
- **Every gather is a collective.** All ranks must run the same all-gathers in the same order. Rank 0's
  source calls ``before_pass`` (the learner's `BatchFanout.gather`, one order to the other ranks) when a
  pass opens; each other rank then runs `follow_pass`: every parameter's all-gather in `named_parameters`
  order, keeping none. A pass always ends having gathered every parameter, also when its reader stopped
  early (every rollout failed mid-push): the missing gathers are run and dropped, so the other ranks are
  never left inside one. When a gather itself fails (a rank died), nothing more is gathered; the learner
  ends (`LearnerRanksFailed`).
- **Resends re-gather.** A transfer that must send the data again within one push (the rollouts behind a
  broken relay chain, or a second wave of rollouts that were ready later) opens another pass, i.e. another
  ordered gather: keeping the gathered model for a possible resend is what this module avoids.

`peak_bytes` is the measured high-water mark of one pass: the bytes of gathered parameters alive at once
(a parameter counts until nothing views its memory any more: a slice on the wire keeps it alive), so
tests and benchmarks check the bound instead of trusting it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch.distributed.tensor import DTensor

from drmas.weights.chunks import TensorSpec, dtype_name, use_count


def whole(param: torch.Tensor) -> torch.Tensor:
    """``param`` whole: its DTensor's all-gather (a collective), or the tensor itself when it is not sharded."""
    data = param.detach()
    return data.full_tensor() if isinstance(data, DTensor) else data


class _Held:
    """A gathered parameter and how many tensors viewed its memory when it was made (see `still_viewed`)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.baseline = use_count(tensor)
        self.nbytes = tensor.untyped_storage().nbytes()

    def still_viewed(self) -> bool:
        """Whether something besides this record still views the memory (a slice being broadcast)."""
        return self.baseline is not None and use_count(self.tensor) > self.baseline


class GatherPass(Sequence):
    """One pass: item ``i`` is parameter ``i`` whole, gathered when first asked for (ascending order only)."""

    def __init__(self, params: list[tuple[str, torch.Tensor]]) -> None:
        self._params = params
        self._next = 0  # index of the next parameter to gather
        self._current: torch.Tensor | None = None
        self._held: list[_Held] = []
        self.broken = False
        self.peak_bytes = 0

    def __len__(self) -> int:
        return len(self._params)

    def __getitem__(self, index: int) -> torch.Tensor:  # type: ignore[override]
        if index < self._next - 1:
            raise RuntimeError(f"a streamed pass is read in order: asked for {self._params[index][0]!r} after "
                               f"{self._params[self._next - 1][0]!r}")
        while self._next <= index:
            self._current = self._gather(self._next)
            self._next += 1
        return self._current  # type: ignore[return-value]

    def _gather(self, index: int) -> torch.Tensor:
        self._current = None
        self._held = [held for held in self._held if held.still_viewed()]  # the rest is freed here
        try:
            tensor = whole(self._params[index][1])
        except Exception:
            self.broken = True  # the other ranks cannot be relied on to take part in any further gather
            raise
        self._held.append(_Held(tensor))
        self.peak_bytes = max(self.peak_bytes, sum(held.nbytes for held in self._held))
        return tensor

    def finish(self) -> None:
        """Run the gathers the reader did not ask for (the other ranks run all of them), then let go."""
        if not self.broken and self._next < len(self._params):
            self[len(self._params) - 1]
        self._current = None
        self._held = []


class GatheredWeights:
    """The weights of a sharded model as a `WeightSource`; see the module docstring.

    ``before_pass``: called on rank 0 when a pass opens, to order the other ranks into it (None on those
    ranks, which join each pass through `follow_pass`)."""

    concurrent = False  # a pass is a collective: only on the thread that runs the learner's collectives

    def __init__(self, model: torch.nn.Module, before_pass: Callable[[], None] | None = None) -> None:
        self._params = [(name, param) for name, param in model.named_parameters()]
        self._before_pass = before_pass
        self.peak_bytes = 0  # of the last pass

    def specs(self) -> list[TensorSpec]:
        return [TensorSpec(name, list(param.shape), dtype_name(param.dtype)) for name, param in self._params]

    def model_bytes(self) -> int:
        """Bytes of the whole weights (what one gathered copy of the model would take)."""
        return sum(spec.nbytes for spec in self.specs())

    @contextmanager
    def open(self) -> Iterator[GatherPass]:
        if self._before_pass is not None:
            self._before_pass()
        gathered = GatherPass(self._params)
        try:
            yield gathered
        finally:
            try:
                gathered.finish()
            finally:
                self.peak_bytes = gathered.peak_bytes

    def follow_pass(self) -> None:
        """Another rank: take part in rank 0's pass (every gather, none kept)."""
        with self.open():
            pass
