"""The embedded engine: batched sampling with a transformers model in this process (CPU by default).

Why not ``model.generate()``: the learner needs, for every sampled token, its log-prob under the full
``softmax(logits / temperature)`` in float32 (the behaviour policy of PPO), per-row sampling settings in one
batch, per-request seeds, stop strings that are cheap to check, and in-place weight updates stamped with a
version. A small hand-written decode loop over transformers' KV cache gives all of that and is at least as
fast as ``generate()`` on CPU (see ``bench/engine.py``).

How a batch runs: prompts are sorted by length and cut into chunks of ``max_batch_size`` (similar lengths
-> little padding); each chunk is left-padded, prefilled in one forward pass that computes logits for the
last position only, then decoded one token per step over a ``DynamicCache``. Rows that finish are dropped
from the batch (cache included) once enough of them have finished to pay for the copy.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from drmas.engines import ENGINES
from drmas.engines.base import Generation, SamplingParams, check_request
from drmas.engines.logprobs import left_pad

# Drop finished rows once at least this fraction of the batch has finished (and at least one row):
# compaction copies the KV cache once, while every step with dead rows wastes their share of the compute.
_COMPACT_FRACTION = 0.125


# ------------------------------------------------------------------------------------------ sampling


def sample_tokens(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return ``(tokens, logprobs)``.

    ``temperature`` 0 means greedy; the log-prob is then taken at temperature 1. The log-prob is always
    under the full tempered distribution (before top-p truncation), which is what the learner recomputes.
    Sampling is by inverse CDF with one given uniform per row, so a row's draw depends only on its own
    uniform stream (per-request seeds stay reproducible whatever else is in the batch).
    """
    logits = logits.float()
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / scale.unsqueeze(-1), dim=-1)
    if bool(greedy.all()):
        tokens = logits.argmax(dim=-1)
    else:
        tokens = _sample_from(logp.exp(), top_p, uniforms)
        if bool(greedy.any()):
            tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _sample_from(probs: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling per row, with nucleus truncation only for the rows that ask for it (a sort is costly)."""
    nucleus = top_p < 1.0
    if not bool(nucleus.any()):
        return _inverse_cdf(probs, uniforms)
    if bool(nucleus.all()):
        return _nucleus_sample(probs, top_p, uniforms)
    tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    tokens[~nucleus] = _inverse_cdf(probs[~nucleus], uniforms[~nucleus])
    tokens[nucleus] = _nucleus_sample(probs[nucleus], top_p[nucleus], uniforms[nucleus])
    return tokens


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index i with cdf[i-1] <= u * total < cdf[i]; float64 so tokens of tiny probability stay reachable.

    Zero-weight entries are never chosen (their cdf equals their predecessor's).
    """
    cdf = weights.double().cumsum(dim=-1)
    target = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=weights.shape[-1] - 1)


def _nucleus_sample(probs: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Sample from the smallest set of most likely tokens whose mass reaches top_p (the top token always stays)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    kept = sorted_p * (mass_before < top_p.unsqueeze(-1))
    return order.gather(-1, _inverse_cdf(kept, uniforms).unsqueeze(-1)).squeeze(-1)


# ------------------------------------------------------------------------------------------ batch state


@dataclass
class _Rows:
    """Per-row decode state of the rows still in the batch (all tensors indexed by batch position)."""

    index: torch.Tensor  # position of the row in the chunk's request list
    temperature: torch.Tensor
    top_p: torch.Tensor
    max_new: torch.Tensor
    mask: torch.Tensor  # attention mask for prompt + every step, sliced per step
    position: torch.Tensor  # position id of the next input token
    alive: torch.Tensor  # False once the row has finished (until the batch is compacted)

    def select(self, keep: torch.Tensor) -> "_Rows":
        """The state of the rows at batch positions ``keep``."""
        return _Rows(*(getattr(self, f)[keep] for f in self.__dataclass_fields__))


class _StopStrings:
    """Incremental stop-string detection that decodes only the tail of each response.

    A stop string completed by the newest token lies within the last few tokens, so decoding a short tail
    window each step is enough; decoding whole responses every step would be quadratic.
    """

    def __init__(self, tokenizer, stops: Sequence[tuple[str, ...]]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.rows = [i for i, s in enumerate(stops) if s]
        self.history: dict[int, list[int]] = {i: [] for i in self.rows}
        # A char is at most 4 UTF-8 bytes and a byte-level token at least one byte.
        self.window = {i: 4 * max(len(s) for s in stops[i]) + 4 for i in self.rows}

    def hits(self, index: list[int], tokens: list[int]) -> set[int]:
        """Feed this step's tokens (by chunk row index) and return the rows whose response now holds a stop string."""
        found = set()
        for row, token in zip(index, tokens):
            if row not in self.history:
                continue
            seq = self.history[row]
            seq.append(token)
            tail = self.tokenizer.decode(seq[-self.window[row] :], skip_special_tokens=False)
            if any(stop in tail for stop in self.stops[row]):
                found.add(row)
        return found


class _ChunkResult:
    """Output buffers of one chunk, indexed by the row's position in the chunk's request list."""

    def __init__(self, rows: int, steps: int) -> None:
        self.tokens = torch.zeros((rows, steps), dtype=torch.long)
        self.logprobs = torch.zeros((rows, steps), dtype=torch.float32)
        self.lengths = [0] * rows
        self.stopped = [False] * rows

    def record(self, index: torch.Tensor, step: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> None:
        """Store one step for the rows in the batch (entries past a row's length are ignored later)."""
        self.tokens[index, step] = tokens.cpu()
        self.logprobs[index, step] = logprobs.cpu()

    def finish(self, row: int, length: int, stopped: bool) -> None:
        """Close a row at ``length`` tokens; ``stopped`` means EOS or a stop string rather than the length cap."""
        self.lengths[row] = length
        self.stopped[row] = stopped

    def row(self, row: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(token ids, logprobs, stopped) of one finished row."""
        n = self.lengths[row]
        return self.tokens[row, :n], self.logprobs[row, :n], self.stopped[row]


# ------------------------------------------------------------------------------------------ engine


class EmbeddedEngine:
    """An in-process engine over a transformers causal LM; implements ``drmas.engines.base.Engine``.

    Thread-safe in the one way that matters: ``generate`` and ``load_weights`` exclude each other, so every
    token of a response comes from one weight version and is stamped with it.
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
        self._lock = threading.Lock()
        self._device = next(model.parameters()).device
        self._eos_ids = set(eos_token_ids) if eos_token_ids is not None else _eos_token_ids(model, tokenizer)
        self._eos = torch.tensor(sorted(self._eos_ids), dtype=torch.long, device=self._device)
        self._pad_id = _pad_token_id(tokenizer, self._eos_ids)
        self._max_positions = getattr(model.config, "max_position_embeddings", None)
        self._params = dict(model.named_parameters(remove_duplicate=False))

    @classmethod
    def from_path(
        cls, model_id: str, path: str | Path, dtype: str = "float32", max_batch_size: int = 64, seed: int = 0,
        engine_args: dict | None = None, device: str = "cpu",
    ) -> "EmbeddedEngine":
        """Build an engine from a local HF directory (the factory registered as engine 'embedded'), on
        `device` (a `models.<id>.device` setting)."""
        from drmas.models.devices import resolve_device
        from drmas.models.loading import load_model

        if engine_args:
            raise ValueError(f"rollout.engine_args {sorted(engine_args)}: the embedded engine takes no engine "
                             "arguments (they are vLLM's; set rollout.engine=vllm)")

        model, tokenizer = load_model(path, dtype)
        model.to(resolve_device(device, f"models.{model_id}.device"))
        return cls(model_id, model, tokenizer, max_batch_size=max_batch_size, seed=seed)

    # -------------------------------------------------------------------------------------- weights

    @property
    def version(self) -> int:
        """Weight version stamped on the tokens generated now."""
        return self._version

    def state_dict_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The engine's parameters by name (tied weights once), e.g. to send them or compare them."""
        yield from self.model.named_parameters()

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, incarnation: str = ""
    ) -> None:
        """Copy tensors into the parameters of the same names in place, then set the version (and the
        incarnation of the learner that published it: both are stamped on every later response).

        Streams (no full copy held): known names are copied as they arrive. Unknown names are collected and
        reported together in a KeyError at the end, and the version is then left unchanged; a shape mismatch
        raises ValueError at once. Either way the weights may be partially updated after an error.
        """
        unknown: list[str] = []
        with self._lock, torch.no_grad():
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

    # -------------------------------------------------------------------------------------- generate

    def check(self, prompt: list[int], params: SamplingParams) -> None:
        """ValueError for a request this engine cannot honour (an empty or too long prompt, bad sampling)."""
        check_request(prompt, params, self._max_positions, "model's positions")

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Sample one response per prompt; see the module docstring for how batches are formed."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        for prompt, p in zip(prompts, params):
            self.check(prompt, p)
        results: list[Generation | None] = [None] * len(prompts)
        with self._lock, torch.inference_mode():
            todo = [i for i, p in enumerate(params) if p.max_new_tokens > 0]
            for i in set(range(len(prompts))) - set(todo):
                results[i] = Generation([], [], "", "length", self._version, self._incarnation)
            for chunk in self._chunks(prompts, todo):
                outs = self._generate_chunk([prompts[i] for i in chunk], [params[i] for i in chunk])
                for i, out in zip(chunk, outs):
                    results[i] = out
        return results  # type: ignore[return-value]

    def _chunks(self, prompts: list[list[int]], todo: list[int]) -> list[list[int]]:
        """The ``todo`` request indices sorted by prompt length and cut into batches of at most max_batch_size."""
        order = sorted(todo, key=lambda i: len(prompts[i]))
        return [order[i : i + self.max_batch_size] for i in range(0, len(order), self.max_batch_size)]

    def _generate_chunk(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Prefill then decode one batch; returns the generations in request order."""
        steps = max(p.max_new_tokens for p in params)
        result = _ChunkResult(len(prompts), steps)
        self._decode(prompts, params, steps, result)
        return [self._to_generation(*result.row(i)) for i in range(len(prompts))]

    def _decode(self, prompts: list[list[int]], params: list[SamplingParams], steps: int, result: "_ChunkResult") -> None:
        """The decode loop: sample, record, retire finished rows, compact, feed the new tokens back."""
        rows, logits, cache = self._prefill(prompts, params, steps)
        seeded = {i: torch.Generator().manual_seed(p.seed) for i, p in enumerate(params) if p.seed is not None}
        stops = _StopStrings(self.tokenizer, [p.stop for p in params])
        width = rows.mask.shape[1] - steps  # padded prompt width
        for step in range(steps):
            new, new_logp = sample_tokens(logits, rows.temperature, rows.top_p, self._uniforms(rows.index, seeded))
            result.record(rows.index, step, new, new_logp)
            rows.alive &= ~self._finished(new, rows, step, stops, result)
            if not bool(rows.alive.any()):
                break
            dead = len(rows.alive) - int(rows.alive.sum())
            if dead >= max(1, int(_COMPACT_FRACTION * len(rows.alive))):
                keep = rows.alive.nonzero().flatten()
                rows, new = rows.select(keep), new[keep]
                cache.batch_select_indices(keep)
            logits = self._forward_step(new, rows, width + step + 1, cache)
            rows.position += 1

    def _prefill(self, prompts: list[list[int]], params: list[SamplingParams], steps: int):
        """Run the padded prompts once; returns (row state, last-position logits, filled KV cache)."""
        from transformers import DynamicCache

        ids, prompt_mask, positions = left_pad(prompts, self._pad_id)
        n, width = ids.shape
        mask = torch.ones((n, width + steps), dtype=torch.long)
        mask[:, :width] = prompt_mask
        dev = self._device
        rows = _Rows(
            index=torch.arange(n),
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev),
            max_new=torch.tensor([p.max_new_tokens for p in params], dtype=torch.long, device=dev),
            mask=mask.to(dev),
            position=prompt_mask.sum(-1).to(dev),
            alive=torch.ones(n, dtype=torch.bool, device=dev),
        )
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=ids.to(dev),
            attention_mask=prompt_mask.to(dev),
            position_ids=positions.to(dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return rows, out.logits[:, -1], out.past_key_values

    def _forward_step(self, new: torch.Tensor, rows: _Rows, kv_len: int, cache) -> torch.Tensor:
        """One decode step: feed each row's newest token (``kv_len`` = cached + new columns), return logits [rows, vocab]."""
        out = self.model(
            input_ids=new.unsqueeze(-1),
            attention_mask=rows.mask[:, :kv_len],
            position_ids=rows.position.unsqueeze(-1),
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits[:, -1]

    def _uniforms(self, index: torch.Tensor, seeded: dict[int, torch.Generator]) -> torch.Tensor:
        """One uniform per row: from the row's own generator if it has a seed, else from the engine's."""
        u = torch.rand(len(index), generator=self._generator, dtype=torch.float64)
        if seeded:
            for pos, row in enumerate(index.tolist()):
                gen = seeded.get(row)
                if gen is not None:
                    u[pos] = torch.rand(1, generator=gen, dtype=torch.float64)[0]
        return u.to(self._device)

    def _finished(
        self, new: torch.Tensor, rows: _Rows, step: int, stops: _StopStrings, result: "_ChunkResult"
    ) -> torch.Tensor:
        """Live rows (batch positions) that end with this step's token by EOS, stop string or length; records why."""
        stop = torch.isin(new, self._eos) & rows.alive
        if stops.rows:
            stop |= self._stop_string_hits(new, rows, stops)
        done = stop | (rows.alive & (rows.max_new <= step + 1))
        if bool(done.any()):
            index = rows.index.tolist()
            for pos in done.nonzero().flatten().tolist():
                result.finish(index[pos], step + 1, bool(stop[pos]))
        return done

    def _stop_string_hits(self, new: torch.Tensor, rows: _Rows, stops: _StopStrings) -> torch.Tensor:
        """Bool per batch position: a live row whose response now contains one of its stop strings."""
        index, alive = rows.index.tolist(), rows.alive.tolist()
        live = [(row, tok) for row, tok, a in zip(index, new.tolist(), alive) if a]
        hit = stops.hits([row for row, _ in live], [tok for _, tok in live])
        return torch.tensor([row in hit for row in index], dtype=torch.bool, device=new.device)

    def _to_generation(self, token_ids: torch.Tensor, logprobs: torch.Tensor, stopped: bool) -> Generation:
        """Package one row; the text leaves out a final EOS token (the token ids keep it, it is trained on)."""
        ids = token_ids.tolist()
        text_ids = ids[:-1] if ids and ids[-1] in self._eos_ids else ids
        return Generation(
            token_ids=ids,
            logprobs=logprobs.tolist(),
            text=self.tokenizer.decode(text_ids, skip_special_tokens=False),
            finish_reason="stop" if stopped else "length",
            version=self._version,
            incarnation=self._incarnation,
        )


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


ENGINES.register("embedded")(EmbeddedEngine.from_path)
