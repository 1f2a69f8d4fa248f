"""The worker side of a vLLM engine's weight updates: methods vLLM adds to each of its workers.

vLLM loads this class into its workers (`LLM(worker_extension_cls=...)`) and `collective_rpc` calls its
methods there. Loading goes through the model runner's ``reload_weights``, which takes checkpoint-format
(Hugging Face) names and redoes whatever packing or fusing vLLM applied at load time (fused QKV, gate-up,
the CPU backend's repacked GEMM weights) and cuts each tensor-parallel worker's shard from the full tensor,
so drmas can stream exactly what its learner's ``named_parameters()`` yields.

Two ways the weights reach a worker:

* ``drmas_load_weights``: the rollout process received them and hands them over by reference (an engine
  whose single worker lives in the rollout process);
* ``drmas_weights_connect`` / ``_receive`` / ``_close``: the worker is itself a rank of the learner's pair
  group (`drmas.weights.rollout.member`) and receives every broadcast unit on its own device -- NCCL straight into
  GPU memory, one worker per tensor-parallel rank. Arguments cross the process boundary as msgpack bytes.

One trap on CPU, measured: with tied input and output embeddings (SmolLM2, small Qwen models) the CPU
backend keeps a separately packed copy of ``lm_head`` that ``reload_weights`` does not refresh, and every
logit after an update would come from the old head. It is re-packed here after each load.
"""

from __future__ import annotations

from typing import Iterable

import msgspec
import torch

from drmas.weights.chunks import Layout
from drmas.weights.rollout.member import PairMember, PairSpec


class DrmasWorkerExtension:
    """Mixed into vLLM's worker class: ``self.model_runner`` is the worker's model runner, ``self.rank`` its
    rank among the engine's workers."""

    def drmas_load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.reload_weights(weights_iterator=named_tensors)
        _refresh_tied_cpu_head(self.model_runner.get_model())

    def drmas_weights_connect(self, spec: bytes) -> None:
        """Build this worker's end (rank 1 + its worker rank) of the pair described by ``spec``."""
        pair_spec = msgspec.msgpack.decode(spec, type=PairSpec)
        self.drmas_weights_close(pair_spec.pair_id)
        _members(self)[pair_spec.pair_id] = PairMember(pair_spec, rank=1 + self.rank)

    def drmas_weights_receive(self, pair_id: str, layout: bytes) -> None:
        """Receive one update over the pair and load it; raises if the pair failed or the load did."""
        member = _members(self).get(pair_id)
        if member is None:
            raise RuntimeError(f"worker {self.rank} has no end of weight pair {pair_id}")
        stream = member.stream(msgspec.msgpack.decode(layout, type=Layout))
        try:
            self.drmas_load_weights(stream.tensors())
        finally:
            stream.finish()  # receive what the loader did not take: the learner's broadcasts must all complete
        if stream.failed is not None:
            raise RuntimeError(f"worker {self.rank}: weight transfer over pair {pair_id} failed: {stream.failed}")

    def drmas_weights_close(self, pair_id: str) -> None:
        member = _members(self).pop(pair_id, None)
        if member is not None:
            member.close()


def _members(worker) -> dict[str, PairMember]:
    """The pair ends this worker holds, by pair id (kept on the worker object)."""
    members = getattr(worker, "_drmas_pair_members", None)
    if members is None:
        members = worker._drmas_pair_members = {}
    return members


def _refresh_tied_cpu_head(model: torch.nn.Module) -> None:
    """Re-pack a tied ``lm_head`` on the CPU backend (a no-op elsewhere), see the module docstring."""
    from vllm.platforms import current_platform

    head = getattr(model, "lm_head", None)
    config = getattr(model, "config", None)
    if head is None or not current_platform.is_cpu() or not getattr(config, "tie_word_embeddings", False):
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)
