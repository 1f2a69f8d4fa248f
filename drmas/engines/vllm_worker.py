"""The worker side of a vLLM engine's weight updates: methods vLLM adds to each of its workers.

vLLM loads this class into its workers (`LLM(worker_extension_cls=...)`) and `collective_rpc` calls its
methods there. Loading goes through the model runner's ``reload_weights``, which takes checkpoint-format
(Hugging Face) names and redoes whatever packing or fusing vLLM applied at load time (fused QKV, gate-up,
the CPU backend's repacked GEMM weights), so drmas can stream exactly what its learner's
``named_parameters()`` yields.

One trap on CPU, measured: with tied input and output embeddings (SmolLM2, small Qwen models) the CPU
backend keeps a separately packed copy of ``lm_head`` that ``reload_weights`` does not refresh, and every
logit after an update would come from the old head. It is re-packed here after each load.
"""

from __future__ import annotations

from typing import Iterable

import torch


class DrmasWorkerExtension:
    """Mixed into vLLM's worker class: ``self.model_runner`` is the worker's model runner."""

    def drmas_load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.reload_weights(weights_iterator=named_tensors)
        _refresh_tied_cpu_head(self.model_runner.get_model())


def _refresh_tied_cpu_head(model: torch.nn.Module) -> None:
    """Re-pack a tied ``lm_head`` on the CPU backend (a no-op elsewhere), see the module docstring."""
    from vllm.platforms import current_platform

    head = getattr(model, "lm_head", None)
    config = getattr(model, "config", None)
    if head is None or not current_platform.is_cpu() or not getattr(config, "tie_word_embeddings", False):
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)
