"""LoRA adapters on a frozen base model (peft): attaching them, naming their tensors, saving and merging them.

A model with `models.<id>.adapters` is held once and wrapped by peft with every adapter it serves (an engine)
or the one it trains (a learner; the colocated loop: all of them on one shared base). peft does the LoRA
arithmetic, the freezing of the base, mixed-adapter batches (`adapter_names=` in the forward pass) and the
on-disk format; this module only adds what drmas needs around it.

Names. An adapter's tensors travel (weight pushes) and are stored (checkpoints) under the names peft saves
them with: the parameter's name with the adapter's own key left out (`...q_proj.lora_A.weight` for the
parameter `...q_proj.lora_A.solver.weight`). So a push, a checkpoint's adapter directory, `PeftModel.
from_pretrained` and vLLM's LoRA loader all read one format, and an adapter's tensors load into any adapter
of the same shape on the other side whatever it is called there. The names are derived here rather than with
peft's `get_peft_model_state_dict`, which selects an adapter's tensors by substring (adapters `a` and `ab`
would mix); `tests/test_lora.py` checks both give the same names.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

from drmas.weights.learner.source import NamedTensors

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter to attach: its name and shape (`models.<id>.adapters.<name>`), and optionally the peft
    adapter directory whose weights it starts from (a checkpoint's); else peft's initialisation (B = 0: the
    adapter starts as the base)."""

    name: str
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    dtype: torch.dtype = torch.float32  # of its parameters (`models.<id>.dtype`: a learner's master weights)
    init_dir: Path | None = None

    @classmethod
    def of(cls, name: str, cfg, dtype: torch.dtype = torch.float32, init_dir: Path | None = None) -> "AdapterSpec":
        """From an `AdapterConfig`."""
        return cls(name, cfg.rank, float(cfg.alpha), float(cfg.dropout), tuple(cfg.target_modules), dtype, init_dir)

    def lora_config(self, inference: bool):
        from peft import LoraConfig

        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules), bias="none", inference_mode=inference)


def attach_adapters(model: torch.nn.Module, specs: Sequence[AdapterSpec], *, trainable: bool, seed: int = 0,
                    where: str = "adapters"):
    """`model` wrapped by peft with `specs` (a `PeftModel`; the base's parameters frozen, in place). The
    adapters' parameters are in their spec's dtype (float32 over a bfloat16 base: the master weights a learner
    trains, and what an engine applies them in); `trainable` leaves them trainable (a learner) or frozen (an engine). Each adapter is initialised
    from `seed` and its name alone, so a learner holding one adapter and the colocated loop holding them all
    start from the same weights. `where`: the config key of the adapters, named in errors (a target module
    the model does not have)."""
    from peft import get_peft_model

    if not specs:
        raise ValueError(f"{where}: no adapters to attach")
    first = specs[0]
    peft_model = None
    for spec in specs:
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(zlib.crc32(f"{seed}:{spec.name}".encode()))
                if peft_model is None:
                    peft_model = get_peft_model(model, spec.lora_config(not trainable), adapter_name=spec.name)
                else:
                    peft_model.add_adapter(spec.name, spec.lora_config(not trainable))
        except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
            raise ValueError(f"{where}.{spec.name}.target_modules {list(spec.target_modules)}: {exc}") from None
    for spec in specs:
        for param in adapter_parameters(peft_model, spec.name).values():
            param.data = param.data.to(spec.dtype)
            param.requires_grad_(trainable and spec is first)
        if spec.init_dir is not None:
            load_adapter_dir(peft_model, spec.name, spec.init_dir, f"{where}.{spec.name}")
    if trainable:
        peft_model.set_adapter(first.name)
    return peft_model


def adapter_parameters(model: torch.nn.Module, adapter: str) -> dict[str, torch.nn.Parameter]:
    """Saved name -> parameter of `adapter` in the peft model `model` (see the module docstring)."""
    key = f".{adapter}."
    return {name.replace(key, ".", 1): param for name, param in model.named_parameters()
            if "lora_" in name and key in name}


def adapter_fqns(model: torch.nn.Module, adapter: str) -> set[str]:
    """The full parameter names of `adapter` in `model` (as `named_parameters` and state dicts name them)."""
    key = f".{adapter}."
    return {name for name, _ in model.named_parameters() if "lora_" in name and key in name}


def use_adapter(model: torch.nn.Module, adapter: str) -> None:
    """Make `adapter` the one the forward passes of `model` apply (and the only trainable one); a no-op when it
    is already (a learner of one adapter pays nothing)."""
    if model.active_adapter != adapter:
        model.set_adapter(adapter)


class AdapterTensors(NamedTensors):
    """One adapter's live parameters under their saved names: what an adapter's weight push sends (a few MB
    where a push of the whole model would send hundreds). Listed afresh for every pass, never copied; the owner
    changes them only inside `WeightSender.exclusive` (as with `LiveParameters`)."""

    def __init__(self, model: torch.nn.Module, adapter: str) -> None:
        super().__init__([])
        self._model, self._adapter = model, adapter

    def named(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, param.detach()) for name, param in adapter_parameters(self._model, self._adapter).items()]


def load_adapter_tensors(model: torch.nn.Module, adapter: str, named: Iterable[tuple[str, torch.Tensor]],
                         where: str) -> int:
    """Copy saved-name tensors into `adapter`'s parameters (any device or dtype), as they come; returns how many.
    Unknown names are reported together at the end (KeyError), a shape mismatch at once (ValueError); the
    adapter may be partly updated after either."""
    params = adapter_parameters(model, adapter)
    unknown: list[str] = []
    count = 0
    with torch.no_grad():
        for name, tensor in named:
            param = params.get(name)
            if param is None:
                unknown.append(name)
                continue
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, the adapter's is "
                                 f"{tuple(param.shape)} (another rank or target_modules?)")
            param.copy_(tensor)
            count += 1
    if unknown:
        raise KeyError(f"{where}: {len(unknown)} tensor(s) match no parameter of adapter {adapter!r}, e.g. "
                       f"{unknown[:3]} (another model or target_modules?)")
    return count


def load_adapter_dir(model: torch.nn.Module, adapter: str, path: Path, where: str) -> None:
    """Load the weights of a peft adapter directory (`save_pretrained`'s, or a checkpoint's) into `adapter`;
    every tensor of the adapter must be there."""
    from safetensors.torch import load_file

    file = Path(path) / ADAPTER_WEIGHTS
    if not file.is_file():
        raise FileNotFoundError(f"{where}: {str(path)!r} is not a peft adapter directory (no {ADAPTER_WEIGHTS})")
    tensors = load_file(str(file))
    loaded = load_adapter_tensors(model, adapter, tensors.items(), f"{where} ({file})")
    expected = len(adapter_parameters(model, adapter))
    if loaded != expected:
        raise ValueError(f"{where}: {file} holds {loaded} of the adapter's {expected} tensors")


def write_adapter_dir(out: Path, lora_config, tensors: Mapping[str, torch.Tensor]) -> Path:
    """A peft adapter directory (adapter_config.json + adapter_model.safetensors) from saved-name tensors:
    what `PeftModel.from_pretrained` and vLLM's LoRA loader read."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lora_config.save_pretrained(str(out))
    save_file({name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}, str(out / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    return out


def save_adapter(model: torch.nn.Module, adapter: str, out: Path) -> Path:
    """`adapter` of `model` in peft's format (its own config and weights, nothing of the base)."""
    return write_adapter_dir(out, model.peft_config[adapter], adapter_parameters(model, adapter))


def merged_state_dict(model: torch.nn.Module, adapter: str) -> dict[str, torch.Tensor]:
    """The base's weights with `adapter` merged in, under the base model's own names. Computed beside the
    model (the base is shared by other adapters and must not change, so peft's in-place merge is not used):
    only the adapted layers' weights are new tensors."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged = {name.replace(".base_layer.", "."): tensor for name, tensor in base.state_dict().items()
              if "lora_" not in name}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and adapter in module.lora_A:
                weight = module.get_base_layer().weight
                delta = module.get_delta_weight(adapter)
                merged[f"{name}.weight"] = (weight.float() + delta.float()).to(weight.dtype)
    return merged


class AdapterExport:
    """An adapter as a checkpoint writes it: `save_pretrained(out)` (what `save_checkpoint_model` calls)
    writes the adapter in peft's format and, with `merged`, the base with the adapter merged in as a plain
    Hugging Face directory `out/merged/` (with `tokenizer`)."""

    def __init__(self, model: torch.nn.Module, adapter: str, tokenizer=None, merged: bool = False) -> None:
        self.model, self.adapter, self.tokenizer, self.merged = model, adapter, tokenizer, merged

    def save_pretrained(self, out: str | Path) -> None:
        out = Path(out)
        save_adapter(self.model, self.adapter, out)
        if self.merged:
            self.model.get_base_model().save_pretrained(out / "merged",
                                                        state_dict=merged_state_dict(self.model, self.adapter))
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(out / "merged")
