"""The embedded engine: batched sampling with a transformers model in this process (on the model's device).

Why not ``model.generate()``: the learner needs, for every sampled token, its log-prob under the full
``softmax(logits / temperature)`` in float32 (the behaviour policy of PPO), per-row sampling settings in one
batch, per-request seeds, stop strings that are cheap to check, requests that join a running batch, and
in-place weight updates stamped with a version. A small hand-written decode loop over transformers' KV cache
gives all of that and is as fast as ``generate()`` on the same batch (see ``bench/engine.py``).

How requests run (`drmas.engines.decode_batch`): requests wait in a queue; each `step` decodes one token
for every row of the running batch and returns the requests that finished in it. Queued requests join the
batch (prefilled in one forward pass that computes logits for the last position only, then merged into
the KV cache) as soon as enough of it is free; finished rows are dropped once enough of them have
finished to pay for the copy. `generate` is the same loop run until its prompts are all done, with the
prompts queued longest first (similar lengths -> little padding, and a joining prompt is never wider than
the running batch, so only the joining rows are padded).

LoRA adapters (docs/lora.md): an engine built with `adapters` holds its base once, wrapped by peft with every
adapter; each request names its adapter (`SamplingParams.adapter`) and rows of different adapters decode in
one batch (`drmas.engines.decode_batch`). Each adapter has a version of its own, and `load_adapter` waits
only for the requests of that adapter.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import torch

from drmas.models.devices import exact_float32
from drmas.engines.base import Generation, SamplingParams, check_request
from drmas.engines.decode_batch import DecodeBatch, Row, StopStrings
from drmas.engines.grammar import Grammars
from drmas.engines.sampling import sample_tokens

if TYPE_CHECKING:
    from drmas.models.adapters import AdapterSpec

__all__ = ["EmbeddedEngine", "sample_tokens"]

# Drop finished rows once at least this fraction of the batch has finished (and at least one row):
# compaction copies the KV cache once, while every step with dead rows wastes their share of the compute.
# Queued requests join once this fraction of the batch is free (a prefill of one row per step would cost
# a forward pass per step), or at once when nothing runs.
_COMPACT_FRACTION = 0.125


class EmbeddedEngine:
    """An in-process engine over a transformers causal LM; implements ``drmas.engines.base.Engine`` and its
    request level (``RequestEngine``).

    Thread-safe in the one way that matters: a step (or a whole `generate`) and `load_weights` exclude each
    other, and weights cannot change while a request is in progress, so every token of a response comes
    from one weight version and is stamped with it.
    """

    def __init__(
        self,
        model_id: str,
        model,
        tokenizer,
        max_batch_size: int = 64,
        seed: int = 0,
        *,
        eos_token_ids: Iterable[int] | None = None,
    ) -> None:
        """``eos_token_ids`` overrides the ids that end a response (default: tokenizer + generation config);
        an empty set makes every response run to max_new_tokens, as benchmarks need."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model_id = model_id
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self._version = 0
        self._incarnation = ""
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.RLock()
        self._device = next(model.parameters()).device
        exact_float32(self._device)
        self._eos_ids = set(eos_token_ids) if eos_token_ids is not None else _eos_token_ids(model, tokenizer)
        self._pad_id = _pad_token_id(tokenizer, self._eos_ids)
        self._max_positions = getattr(model.config, "max_position_embeddings", None)
        self._params = dict(model.named_parameters(remove_duplicate=False))
        # adapter -> (version, incarnation); empty: the model serves no adapters (not a peft model)
        self._adapters: dict[str, tuple[int, str]] = {name: (0, "") for name in getattr(model, "peft_config", {})}
        self._queue: deque[tuple[str, list[int], SamplingParams]] = deque()
        self._batch = DecodeBatch(self.model, self._pad_id, self._device, adapters=bool(self._adapters))
        self._stops = StopStrings(tokenizer)
        self._grammars = Grammars(tokenizer, model.get_output_embeddings().weight.shape[0], self._eos_ids)
        self._ready: list[tuple[str, Generation]] = []  # finished without decoding (max_new_tokens = 0)

    @classmethod
    def from_path(
        cls, model_id: str, path: str | Path, dtype: str = "float32", max_batch_size: int = 64, seed: int = 0,
        engine_args: dict | None = None, device: str = "cpu", adapters: Sequence["AdapterSpec"] = (),
    ) -> "EmbeddedEngine":
        """Build an engine from a local HF directory (the factory registered as engine 'embedded'), with its
        weights in `dtype` (the model's compute precision) on `device` (a `models.<id>.device` setting), serving
        the LoRA `adapters` of it (each from its `init_dir`, else as peft initialises it: the base)."""
        from drmas.models.devices import resolve_device
        from drmas.models.loading import load_model

        if engine_args:
            raise ValueError(f"rollout.engine_args {sorted(engine_args)}: the embedded engine takes no engine "
                             "arguments (they are vLLM's; set rollout.engine=vllm)")

        model, tokenizer = load_model(path, dtype, device=resolve_device(device, f"models.{model_id}.device"))
        if adapters:
            from drmas.models.adapters import attach_adapters

            model = attach_adapters(model, adapters, trainable=False, where=f"models.{model_id}.adapters")
        return cls(model_id, model, tokenizer, max_batch_size=max_batch_size, seed=seed)

    # -------------------------------------------------------------------------------------- weights

    @property
    def version(self) -> int:
        """Weight version stamped on the tokens generated now."""
        return self._version

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the engine's weights: what it computes in, and what a weight push should send."""
        return next(self.model.parameters()).dtype

    def state_dict_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The engine's parameters by name (tied weights once), e.g. to send them or compare them."""
        yield from self.model.named_parameters()

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, incarnation: str = ""
    ) -> None:
        """Copy tensors into the parameters of the same names in place (any device, cast to the engine's
        dtype), then set the version (and the incarnation of the learner that published it: both are stamped
        on every later response).

        Streams (no full copy held): known names are copied as they arrive. Unknown names are collected and
        reported together in a KeyError at the end, and the version is then left unchanged; a shape mismatch
        raises ValueError at once. Either way the weights may be partially updated after an error. Refused
        (RuntimeError) while requests are in progress: their responses would mix two versions.
        """
        unknown: list[str] = []
        with self._lock, torch.no_grad():
            if self.in_progress():
                raise RuntimeError(f"{self.model_id}: load_weights while {self.in_progress()} requests are in "
                                   "progress (hold or abort them first)")
            for name, tensor in named_tensors:
                param = self._params.get(name)
                if param is None:
                    unknown.append(name)
                    continue
                if tuple(param.shape) != tuple(tensor.shape):
                    raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} != model's {tuple(param.shape)}")
                param.copy_(tensor)
            if unknown:
                raise KeyError(f"{self.model_id}: unknown weight names {unknown}")
            self._version, self._incarnation = int(version), incarnation

    # -------------------------------------------------------------------------------------- adapters

    def adapter_version(self, adapter: str) -> int:
        """Weight version of `adapter` stamped on the tokens it generates now."""
        return self._adapter_state(adapter)[0]

    def load_adapter(self, adapter: str, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int,
                     incarnation: str = "") -> None:
        """Copy an adapter's tensors (peft's saved names) into it in place, as they arrive, then set its version
        and incarnation. Refused (RuntimeError) while requests of this adapter are in progress; requests of the
        other adapters may run. Errors as `load_weights` (the adapter may then be partly updated)."""
        from drmas.models.adapters import load_adapter_tensors

        with self._lock:
            self._adapter_state(adapter)
            busy = self._in_progress_of(adapter)
            if busy:
                raise RuntimeError(f"{self.model_id}: load_adapter({adapter!r}) while {busy} of its requests are in "
                                   "progress (hold or abort them first)")
            load_adapter_tensors(self.model, adapter, named_tensors, f"{self.model_id}/{adapter}")
            self._adapters[adapter] = (int(version), incarnation)

    def _adapter_state(self, adapter: str) -> tuple[int, str]:
        state = self._adapters.get(adapter)
        if state is None:
            raise KeyError(f"{self.model_id}: no adapter {adapter!r} (it serves {sorted(self._adapters) or 'none'})")
        return state

    def _in_progress_of(self, adapter: str) -> int:
        """Requests of `adapter` queued or decoding (an empty response finished at submission is not: no token
        of it comes from the weights)."""
        return (sum(params.adapter == adapter for _, _, params in self._queue)
                + sum(row.alive and row.params.adapter == adapter for row in self._batch.rows))

    # -------------------------------------------------------------------------------------- generate

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Sample one response per prompt; see the module docstring for how batches are formed."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        for prompt, p in zip(prompts, params):
            self._check(prompt, p)
        with self._lock:
            if self.in_progress():
                raise RuntimeError(f"{self.model_id}: generate() while {self.in_progress()} submitted requests run")
            for i in sorted(range(len(prompts)), key=lambda i: -len(prompts[i])):
                self._enqueue(str(i), prompts[i], params[i])
            results: dict[str, Generation] = {}
            while self.in_progress():
                results.update(self.step())
        return [results[str(i)] for i in range(len(prompts))]

    # ---------------------------------------------------------------------------------- request level

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Queue one request; it joins the running batch at a later `step`."""
        self._check(prompt, params)
        with self._lock:
            self._enqueue(request_id, prompt, params)

    def _check(self, prompt: list[int], params: SamplingParams) -> None:
        check_request(prompt, params, self._max_positions, "model's positions")
        if params.adapter:
            self._adapter_state(params.adapter)
        if params.constraint is not None:
            self._grammars.compile(params.constraint)  # refused here, with why, rather than in a decode step

    def _enqueue(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        if params.max_new_tokens == 0:
            self._ready.append((request_id, self._generation(Row(request_id, params, None))))
        else:
            self._queue.append((request_id, list(prompt), params))

    def in_progress(self) -> int:
        """Requests submitted and not returned (queued ones included: they start at the next steps)."""
        return len(self._queue) + self._batch.alive + len(self._ready)

    def abort(self, request_ids: Sequence[str]) -> None:
        """Forget requests: queued ones leave the queue, running rows stop (dropped at the next compaction)."""
        gone = set(request_ids)
        with self._lock:
            self._queue = deque(q for q in self._queue if q[0] not in gone)
            self._ready = [(r, g) for r, g in self._ready if r not in gone]
            for row in self._batch.rows:
                if row.request_id in gone:
                    row.alive = False

    def step(self) -> list[tuple[str, Generation]]:
        """One decode step for every running row, after letting queued requests join; returns the requests
        that finished in it."""
        with self._lock, torch.inference_mode():
            done, self._ready = self._ready, []
            batch = self._batch
            joining = self._joining()
            if joining:
                batch.compact()  # before the forward pass: finished rows would only cost it
            batch.forward()
            if joining:
                batch.join([prompt for _, prompt, _ in joining],
                           [Row(rid, p, torch.Generator().manual_seed(p.seed) if p.seed is not None else None,
                                matcher=self._grammars.matcher(p.constraint) if p.constraint else None)
                            for rid, _, p in joining])
            if not batch.alive:
                batch.clear()
                return done
            constrained = [(i, row.matcher) for i, row in enumerate(batch.rows) if row.alive and row.matcher]
            if constrained:
                self._grammars.mask(batch.logits, constrained)
            for row, (token, logprob) in zip(batch.rows, batch.sample(self._uniforms)):
                if not row.alive:
                    continue
                row.tokens.append(token)
                row.logprobs.append(logprob)
                row.stopped = token in self._eos_ids or self._stops.hit(row) or (
                    row.matcher is not None and self._grammars.advance(row.matcher, token))
                if row.stopped or len(row.tokens) >= row.params.max_new_tokens:
                    row.alive = False
                    done.append((row.request_id, self._generation(row)))
            batch.compact(min_dead=int(_COMPACT_FRACTION * len(batch.rows)))
            return done

    def _joining(self) -> list[tuple[str, list[int], SamplingParams]]:
        """The queued requests that join the batch now: as many as fit, once enough of it is free (or
        nothing runs)."""
        batch = self._batch
        free = self.max_batch_size - batch.alive
        if not self._queue or not batch.can_join():
            return []
        if batch.alive and free < max(1, int(_COMPACT_FRACTION * self.max_batch_size)):
            return []
        return [self._queue.popleft() for _ in range(min(free, len(self._queue)))]

    def _uniforms(self, rows: list[Row]) -> torch.Tensor:
        """One uniform per row: from the row's own generator if it has a seed, else from the engine's."""
        u = torch.rand(len(rows), generator=self._generator, dtype=torch.float64)
        for pos, row in enumerate(rows):
            if row.generator is not None:
                u[pos] = torch.rand(1, generator=row.generator, dtype=torch.float64)[0]
        return u.to(self._device, non_blocking=True)

    def _generation(self, row: Row) -> Generation:
        """Package one finished row; the text leaves out a final EOS token (the token ids keep it, it is
        trained on)."""
        ids = row.tokens
        text_ids = ids[:-1] if ids and ids[-1] in self._eos_ids else ids
        return Generation(
            token_ids=list(ids),
            logprobs=list(row.logprobs),
            text=self.tokenizer.decode(text_ids, skip_special_tokens=False),
            finish_reason="stop" if row.stopped else "length",
            **self._stamp(row.params.adapter),
        )

    def _stamp(self, adapter: str) -> dict:
        """The version and incarnation a response of `adapter` ('' = the model) is stamped with."""
        version, incarnation = self._adapters[adapter] if adapter else (self._version, self._incarnation)
        return {"version": version, "incarnation": incarnation}


def _eos_token_ids(model, tokenizer) -> set[int]:
    """EOS ids from the tokenizer and the generation config (chat models often end turns with a second id)."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is not None:
        ids.update([eos] if isinstance(eos, int) else eos)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _pad_token_id(tokenizer, eos_ids: set[int]) -> int:
    """Any id works for padding (it is masked out); prefer the tokenizer's pad, then EOS, then 0."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return min(eos_ids) if eos_ids else 0

