"""LLM engines: the embedded PyTorch engine (default) and, later, vLLM and remote engines."""

from drmas.engines.base import Engine, Generation, SamplingParams
from drmas.registry import Registry

ENGINES: Registry = Registry("engine")

__all__ = ["ENGINES", "Engine", "Generation", "SamplingParams"]
