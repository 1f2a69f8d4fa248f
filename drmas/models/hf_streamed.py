"""A Hugging Face model directory written from a weight source (`drmas.weights.learner.source`), one tensor at a time.

Why: a learner sharded over N ranks (FSDP2) holds no whole copy of its model, and its checkpoints must still
hold the plain HF directory users, transformers and vLLM load. `save_pretrained` needs the whole state dict
in memory; here every tensor is gathered, written and released in turn, so rank 0 never holds more than
one tensor beyond its shard. The safetensors format makes this simple: a file is an 8-byte header length,
a JSON header with every tensor's dtype, shape and byte range, then the bytes back to back. The header is
computed from the source's metadata (`specs`, global shapes) before anything is gathered, then the bytes
are appended as the pass yields them. Files are cut at ``max_shard_bytes`` as transformers does, with
``model.safetensors.index.json`` naming each tensor's file when there is more than one.

Why not DCP's `HuggingFaceStorageWriter` (torch 2.13): with sharded state it has every rank write its own
shard files and then consolidates them into full tensors on one node, which writes the weights twice and
needs every rank's files on one filesystem (ranks on several nodes have their own disks).

Tied weights appear once (a source lists a tied parameter once, as `named_parameters` does; aliases are
skipped), as transformers writes them; it ties them again on load.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Sequence

import torch

from drmas.weights.chunks import TensorSpec
from drmas.weights.learner.source import WeightSource

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 1024**3  # transformers' default max_shard_size (5 GB)

_SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


def _shards(specs: Sequence[TensorSpec], max_shard_bytes: int) -> list[list[int]]:
    """Indices of the tensors each file holds, in order; a file is cut before a tensor that would take it
    past ``max_shard_bytes`` (a larger tensor gets a file of its own)."""
    files: list[list[int]] = [[]]
    size = 0
    for index, spec in enumerate(specs):
        if spec.alias_of >= 0:
            continue
        if files[-1] and size + spec.nbytes > max_shard_bytes:
            files.append([])
            size = 0
        files[-1].append(index)
        size += spec.nbytes
    return files


def _header(specs: Sequence[TensorSpec], indices: list[int]) -> bytes:
    """A safetensors header (length prefix included) for ``indices``' tensors stored back to back."""
    entries: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for index in indices:
        spec = specs[index]
        code = _SAFETENSORS_DTYPES.get(spec.dtype)
        if code is None:
            raise ValueError(f"weight {spec.name!r}: dtype {spec.dtype} has no safetensors code")
        entries[spec.name] = {"dtype": code, "shape": list(spec.shape), "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the safetensors library writes it
    return struct.pack("<Q", len(text)) + text


def _write_tensor(out, tensor: torch.Tensor, spec: TensorSpec) -> None:
    if list(tensor.shape) != list(spec.shape) or tensor.dtype != spec.torch_dtype:
        raise ValueError(f"weight {spec.name!r}: the pass gave {tuple(tensor.shape)} {tensor.dtype}, its metadata "
                         f"says {tuple(spec.shape)} {spec.dtype}")
    if tensor.numel():
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        out.write(memoryview(data.numpy()))


def write_safetensors(source: WeightSource, out_dir: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[Path]:
    """Write the source's tensors as safetensors files in ``out_dir`` in one pass; returns the files."""
    specs = source.specs()
    shards = _shards(specs, max_shard_bytes)
    names = ([SAFE_WEIGHTS] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    with source.open() as tensors:
        for name, indices in zip(names, shards):
            with open(out_dir / name, "wb") as out:
                out.write(_header(specs, indices))
                for index in indices:
                    _write_tensor(out, tensors[index], specs[index])
    if len(shards) > 1:
        weight_map = {specs[i].name: name for name, indices in zip(names, shards) for i in indices}
        total = sum(specs[i].nbytes for indices in shards for i in indices)
        (out_dir / SAFE_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                     indent=2, sort_keys=True))
    return [out_dir / name for name in names]


def model_class_name(model: torch.nn.Module) -> str:
    """The model's own class name: FSDP2 wraps it in a subclass `FSDP<name>`, which no loader knows."""
    from torch.distributed.fsdp import FSDPModule

    return next(cls.__name__ for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


class StreamedPretrained:
    """Stands for a model in `drmas.models.loading.save_checkpoint_model`: its `save_pretrained` writes the config, the
    generation config and the weights of ``source`` streamed (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, source: WeightSource, max_shard_bytes: int | None = None) -> None:
        """``max_shard_bytes``: where safetensors files are cut (None: `MAX_SHARD_BYTES` when saving)."""
        self.model = model
        self.source = source
        self.max_shard_bytes = max_shard_bytes

    def save_pretrained(self, out_dir: str | Path) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for stale in [*out.glob("*.safetensors"), out / SAFE_INDEX]:
            stale.unlink(missing_ok=True)
        config = copy.deepcopy(self.model.config)
        config.architectures = [model_class_name(self.model)]
        dtypes = {spec.dtype for spec in self.source.specs() if spec.alias_of < 0}
        if len(dtypes) == 1:
            config.dtype = dtypes.pop()
        config.save_pretrained(out)
        generation = getattr(self.model, "generation_config", None)
        if generation is not None and self.model.can_generate():
            generation.save_pretrained(out)
        write_safetensors(self.source, out, self.max_shard_bytes or MAX_SHARD_BYTES)
