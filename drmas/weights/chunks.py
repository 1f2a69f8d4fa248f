"""Packing named tensors into flat byte units for broadcast, and unpacking them again.

Pure tensor bookkeeping: nothing here knows about processes or sockets, so the layout logic is unit-tested
on its own and shared by the learner (`Packer`) and the rollouts (`Unpacker`).

Why bytes, not one buffer per dtype: a byte buffer carries any mix of dtypes (bfloat16 beside float32 beside
int64 buffers), so the number of broadcasts depends only on the total size, and every backend can move
uint8. Each tensor starts at a 64-byte aligned offset so that the receiver can view it in place as its dtype
(zero copy) instead of copying it out.

A layout is a list of *units*, one broadcast each:
- a **packed** unit holds whole small tensors at aligned offsets. Packing costs a copy on the sender and
  saves broadcasts (each has a fixed cost, a few hundred microseconds on a busy gloo host). A tensor of at
  least ``direct_bytes`` (default: a quarter chunk) is worth a broadcast of its own: it gets a unit alone,
  which the sender broadcasts straight from the tensor's memory;
- a **sliced** unit holds one slice of a tensor larger than the chunk size. The sender broadcasts straight
  from the tensor's memory and the receiver straight into the destination tensor, so big tensors (the
  embedding matrix) cost no packing copy on either side and still travel in chunk-sized pieces (one huge
  broadcast is several times slower on gloo than the same bytes in tens-of-MB pieces).

Names that share one storage (tied weights, e.g. ``lm_head.weight`` and ``embed_tokens.weight``) are sent
once; the receiver yields every name with the same tensor, each alias right after the tensor it shares.
Other tensors arrive in the order they were given.
"""

from __future__ import annotations

import ctypes
from typing import Iterable, Iterator, Sequence

import msgspec
import torch

ALIGN = 64  # byte alignment of every packed tensor: enough for any dtype view and for vectorised copies


class TensorSpec(msgspec.Struct, array_like=True, frozen=True):
    """One named tensor of an update. ``alias_of`` >= 0: same storage as that earlier tensor, not sent."""

    name: str
    shape: list[int]
    dtype: str
    alias_of: int = -1

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    @property
    def nbytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * self.torch_dtype.itemsize


class Piece(msgspec.Struct, array_like=True, frozen=True):
    """``nbytes`` bytes of tensor ``tensor`` starting at ``tensor_offset``, placed at ``unit_offset`` in a unit."""

    tensor: int
    unit_offset: int
    tensor_offset: int
    nbytes: int


class Unit(msgspec.Struct, array_like=True, frozen=True):
    """One broadcast: ``nbytes`` bytes made of ``pieces``; ``sliced`` units carry one slice of one large tensor."""

    nbytes: int
    pieces: list[Piece]
    sliced: bool = False


class Layout(msgspec.Struct, frozen=True):
    """Everything a receiver needs to turn the broadcast units back into named tensors."""

    tensors: list[TensorSpec]
    units: list[Unit]
    chunk_bytes: int

    @property
    def payload_bytes(self) -> int:
        """Bytes of tensor data carried (aliases counted once, alignment padding not counted)."""
        return sum(spec.nbytes for spec in self.tensors if spec.alias_of < 0)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight layout")
    return dtype


def _align(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def _storage_key(tensor: torch.Tensor) -> tuple | None:
    """Identity of a tensor's exact view of memory; None for empty tensors (they may share address 0)."""
    if tensor.numel() == 0:
        return None
    return (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))


def tensor_specs(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    """Name, shape and dtype of every tensor, in order; a tensor viewing the same memory as an earlier one
    (tied weights) becomes an alias of it (sent once)."""
    specs: list[TensorSpec] = []
    first_of: dict[tuple, int] = {}
    for name, tensor in named_tensors:
        key = _storage_key(tensor)
        if key is not None and key in first_of:
            specs.append(TensorSpec(name, list(tensor.shape), dtype_name(tensor.dtype), alias_of=first_of[key]))
            continue
        if key is not None:
            first_of[key] = len(specs)
        specs.append(TensorSpec(name, list(tensor.shape), dtype_name(tensor.dtype)))
    return specs


def plan_layout(
    named_tensors: Sequence[tuple[str, torch.Tensor]], chunk_bytes: int, direct_bytes: int | None = None
) -> Layout:
    """`plan_units` of the tensors' `tensor_specs`."""
    return plan_units(tensor_specs(named_tensors), chunk_bytes, direct_bytes)


def plan_units(specs: Sequence[TensorSpec], chunk_bytes: int, direct_bytes: int | None = None) -> Layout:
    """Assign every tensor to units of at most ``chunk_bytes`` bytes, preserving the order of ``specs``.

    Only names, shapes and dtypes are needed, not the data: a learner whose weights are sharded over ranks
    announces the layout from its parameters' metadata (global shapes) before gathering anything. Tensors
    of at least ``direct_bytes`` (default: a quarter of ``chunk_bytes``) get units of their own.
    """
    if chunk_bytes < ALIGN:
        raise ValueError(f"chunk size must be at least {ALIGN} bytes, got {chunk_bytes}")
    direct = chunk_bytes // 4 if direct_bytes is None else direct_bytes
    units: list[Unit] = []
    names: set[str] = set()
    pieces: list[Piece] = []
    fill = 0

    def close_packed() -> None:
        nonlocal pieces, fill
        if pieces:
            units.append(Unit(nbytes=fill, pieces=pieces))
        pieces, fill = [], 0

    for index, spec in enumerate(specs):
        if spec.name in names:
            raise ValueError(f"weight name {spec.name!r} appears twice in one update")
        names.add(spec.name)
        if spec.alias_of >= 0:
            continue
        nbytes = spec.nbytes
        if nbytes > chunk_bytes:
            close_packed()
            for start in range(0, nbytes, chunk_bytes):
                size = min(chunk_bytes, nbytes - start)
                units.append(Unit(nbytes=size, pieces=[Piece(index, 0, start, size)], sliced=True))
            continue
        if nbytes >= direct and nbytes > 0:
            close_packed()
            units.append(Unit(nbytes=nbytes, pieces=[Piece(index, 0, 0, nbytes)]))
            continue
        offset = _align(fill)
        if offset + nbytes > chunk_bytes:
            close_packed()
            offset = 0
        pieces.append(Piece(index, offset, 0, nbytes))
        fill = offset + nbytes
    close_packed()
    return Layout(tensors=list(specs), units=units, chunk_bytes=chunk_bytes)


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's data as a flat uint8 tensor (a view when contiguous, else one copy)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` for flat uint8 tensors, as one plain memcpy when both are in CPU memory.

    Why: torch splits a copy of more than a few 10 kB over its intra-op (OpenMP) threads; on a busy machine
    every such fork-join waits for a second core to be free, which made packing a 1 MB unit take ~10 ms
    while the broadcasts it feeds stalled. A single-threaded memcpy (ctypes releases the GIL) runs at memory
    speed and leaves the other core to gloo.
    """
    if dst.device.type == "cpu" and src.device.type == "cpu":
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel())
        return dst
    return dst.copy_(src)


class Packer:
    """Sender side: produces the bytes of each unit from the source tensors.

    ``tensors[i]`` is the tensor of ``layout.tensors[i]`` (aliases may be None: they are never read).
    """

    def __init__(self, layout: Layout, tensors: Sequence[torch.Tensor | None]) -> None:
        if len(tensors) != len(layout.tensors):
            raise ValueError(f"{len(tensors)} tensors for a layout of {len(layout.tensors)}")
        self.layout = layout
        self._tensors = tensors
        self._cached: tuple[int, torch.Tensor] | None = None  # byte view of the last sliced tensor

    def _bytes(self, index: int) -> torch.Tensor:
        if self._cached is not None and self._cached[0] == index:
            return self._cached[1]
        tensor = self._tensors[index]
        if tensor is None:
            raise ValueError(f"tensor {self.layout.tensors[index].name!r} is needed but missing")
        view = _byte_view(tensor)
        self._cached = (index, view)
        return view

    def unit_bytes(self, index: int, scratch: torch.Tensor) -> torch.Tensor:
        """The bytes of unit ``index`` on ``scratch``'s device.

        A unit that is (a slice of) one tensor already on that device is returned as a view of the tensor's
        memory (no copy); anything else is copied into ``scratch`` (at least ``layout.chunk_bytes`` long),
        whose prefix is returned.
        """
        unit = self.layout.units[index]
        if unit.sliced or (len(unit.pieces) == 1 and unit.pieces[0].nbytes == unit.nbytes):
            piece = unit.pieces[0]
            source = self._bytes(piece.tensor)[piece.tensor_offset : piece.tensor_offset + piece.nbytes]
            if source.device == scratch.device:
                return source
            return _copy_bytes(scratch[: unit.nbytes], source)
        out = scratch[: unit.nbytes]
        for piece in unit.pieces:
            if piece.nbytes:
                _copy_bytes(out[piece.unit_offset : piece.unit_offset + piece.nbytes], self._bytes(piece.tensor))
        self._cached = None  # packed tensors are read once; do not keep a copy of a non-contiguous one
        return out


def use_count(tensor: torch.Tensor) -> int | None:
    """How many tensors share ``tensor``'s storage (views included); None where torch does not expose it."""
    counter = getattr(torch._C, "_storage_Use_Count", None)
    if counter is None:
        return None
    return int(counter(tensor.untyped_storage()._cdata))


class _Buffer:
    """A reusable tensor plus what is needed to tell whether anything else still views it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.baseline = use_count(tensor)
        self.lent = False

    def reusable(self) -> bool:
        """Not being filled, and no tensor handed out earlier still views it."""
        return not self.lent and self.baseline is not None and use_count(self.tensor) == self.baseline


class BufferPool:
    """Receive memory, reused across units and updates.

    Tensors handed to the consumer are zero-copy views into this memory. Memory is refilled only once no
    such view is alive any more (torch's storage use count tells), so a consumer that keeps tensors (e.g.
    ``dict(named_tensors)``) stays correct; it merely makes the pool allocate afresh. A streaming consumer
    that copies each tensor and lets it go runs on ``keep`` unit buffers, allocated once.

    Tensors larger than a unit (received slice by slice in place) are cached too when ``keep_large``: on CPU
    a fresh allocation of that size is page-faulted in during the receive, which costs as much as a good part
    of the transfer; the price is holding those tensors (e.g. the embedding) between updates. On CUDA the
    caching allocator already recycles memory, so the default keeps them only on CPU.
    """

    def __init__(self, nbytes: int, device: torch.device, keep: int = 3, keep_large: bool | None = None) -> None:
        self.nbytes = nbytes
        self.device = device
        self.keep = keep
        self.keep_large = device.type == "cpu" if keep_large is None else keep_large
        self._cached: list[_Buffer] = []
        self._large: dict[tuple[tuple[int, ...], torch.dtype], _Buffer] = {}

    def take(self) -> _Buffer:
        """A unit buffer of ``nbytes`` bytes, marked lent until its consumer releases it."""
        for buffer in self._cached:
            if buffer.reusable():
                buffer.lent = True
                return buffer
        buffer = _Buffer(torch.empty(self.nbytes, dtype=torch.uint8, device=self.device))
        if len(self._cached) < self.keep:
            self._cached.append(buffer)
        buffer.lent = True
        return buffer

    def take_large(self, shape: Sequence[int], dtype: torch.dtype) -> _Buffer:
        """A tensor of ``shape``/``dtype`` to receive a large tensor into, marked lent."""
        key = (tuple(shape), dtype)
        buffer = self._large.get(key)
        if buffer is None or not buffer.reusable():
            buffer = _Buffer(torch.empty(key[0], dtype=dtype, device=self.device))
            if self.keep_large:
                self._large[key] = buffer
        buffer.lent = True
        return buffer

    def allocated_bytes(self) -> int:
        return self.nbytes * len(self._cached) + sum(b.tensor.nbytes for b in self._large.values())


class Unpacker:
    """Receiver side: gives the destination of each unit's bytes, then the named tensors it completed."""

    def __init__(self, layout: Layout, pool: BufferPool) -> None:
        if pool.nbytes < max((u.nbytes for u in layout.units if not u.sliced), default=0):
            raise ValueError("buffer pool smaller than the layout's packed units")
        self.layout = layout
        self._pool = pool
        self._aliases: dict[int, list[int]] = {}
        for index, spec in enumerate(layout.tensors):
            if spec.alias_of >= 0:
                self._aliases.setdefault(spec.alias_of, []).append(index)
        self._filling: dict[int, _Buffer] = {}  # packed unit index -> its buffer, until completed
        self._large: dict[int, _Buffer] = {}  # tensor index -> destination being filled slice by slice

    def target(self, index: int) -> torch.Tensor:
        """Where unit ``index``'s bytes must land (a flat uint8 tensor of exactly ``unit.nbytes``)."""
        unit = self.layout.units[index]
        if unit.sliced:
            piece = unit.pieces[0]
            dest = self._large.get(piece.tensor)
            if dest is None:
                spec = self.layout.tensors[piece.tensor]
                dest = self._large[piece.tensor] = self._pool.take_large(spec.shape, spec.torch_dtype)
            return _byte_view(dest.tensor)[piece.tensor_offset : piece.tensor_offset + piece.nbytes]
        buffer = self._pool.take()
        self._filling[index] = buffer
        return buffer.tensor[: unit.nbytes]

    def complete(self, index: int) -> list[tuple[str, torch.Tensor]]:
        """The named tensors finished by unit ``index`` (whose bytes have arrived), aliases included."""
        unit = self.layout.units[index]
        done: list[tuple[int, torch.Tensor]] = []
        if unit.sliced:
            piece = unit.pieces[0]
            if piece.tensor_offset + piece.nbytes == self.layout.tensors[piece.tensor].nbytes:
                dest = self._large.pop(piece.tensor)
                dest.lent = False
                done.append((piece.tensor, dest.tensor))
        else:
            buffer = self._filling.pop(index)
            for piece in unit.pieces:
                spec = self.layout.tensors[piece.tensor]
                if piece.nbytes == 0:
                    tensor = torch.empty(spec.shape, dtype=spec.torch_dtype, device=self._pool.device)
                else:
                    raw = buffer.tensor[piece.unit_offset : piece.unit_offset + piece.nbytes]
                    tensor = raw.view(spec.torch_dtype).view(spec.shape)
                done.append((piece.tensor, tensor))
            buffer.lent = False
        named: list[tuple[str, torch.Tensor]] = []
        for tensor_index, tensor in done:
            named.append((self.layout.tensors[tensor_index].name, tensor))
            for alias in self._aliases.get(tensor_index, ()):
                named.append((self.layout.tensors[alias].name, tensor))
        return named

    def release(self) -> None:
        """Return every buffer still marked as being filled (units posted but never completed, e.g. after
        the consumer stopped early), so the pool can reuse them."""
        for buffer in [*self._filling.values(), *self._large.values()]:
            buffer.lent = False
        self._filling.clear()
        self._large.clear()

    def discard(self, index: int) -> torch.Tensor:
        """A landing place for unit ``index`` whose content will be thrown away (draining after an error)."""
        unit = self.layout.units[index]
        buffer = self._pool.take()  # any unit (a slice of a large tensor too) is at most chunk_bytes
        buffer.lent = False
        return buffer.tensor[: unit.nbytes]


# ------------------------------------------------------------------------------------ in-memory round trip


def pack(named_tensors: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int) -> tuple[Layout, list[torch.Tensor]]:
    """Pack into a layout and one standalone byte tensor per unit (tests, and any non-collective transport)."""
    named = list(named_tensors)
    layout = plan_layout(named, chunk_bytes)
    tensors: list[torch.Tensor | None] = [None] * len(layout.tensors)
    by_name = dict(named)
    for index, spec in enumerate(layout.tensors):
        if spec.alias_of < 0:
            tensors[index] = by_name[spec.name]
    packer = Packer(layout, tensors)
    units = []
    for index in range(len(layout.units)):
        scratch = torch.empty(layout.chunk_bytes, dtype=torch.uint8)
        units.append(packer.unit_bytes(index, scratch).clone())
    return layout, units


def unpack(layout: Layout, units: Sequence[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Inverse of `pack`: yields every named tensor (copies; safe to keep)."""
    if len(units) != len(layout.units):
        raise ValueError(f"{len(units)} unit buffers for a layout of {len(layout.units)} units")
    unpacker = Unpacker(layout, BufferPool(layout.chunk_bytes, torch.device("cpu")))
    for index, data in enumerate(units):
        unpacker.target(index).copy_(data)
        for name, tensor in unpacker.complete(index):
            yield name, tensor.clone()
