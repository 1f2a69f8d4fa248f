"""The embedded engine's running batch: rows that join while others decode (continuous batching).

Why: an engine that decodes a fixed batch until its last row is done runs emptier with every row that
finishes (EOS, a stop string), and a multi-turn rollout hands it the next turns of its episodes only after
the whole batch returns. On a GPU a decode step costs about the same for 8 rows as for 64, so a half-empty
batch halves the tokens/s. Here rows finish on their own step and new requests join the batch at the next
one (prefilled apart, then merged into the KV cache), so the batch stays as full as the requests allow.

Layout: every row's tokens (prompt, then response) are contiguous in the KV cache, from its column `start`
to the last column (rows are left-padded to one width). So a row's attention mask and its position ids
follow from `start` alone: column c is attended iff c >= start, and holds position c - start. Merging
new rows pads the shorter side on the left; columns that no live row uses any more are cut off the left.

Adapters: over a peft model serving LoRA adapters (`adapters=True`), every forward pass names each row's
adapter (`adapter_names=`, peft's mixed-adapter batches: the base's matmuls once for all rows, each adapter's
on its own rows), so requests of different adapters share one batch and one KV cache.

Host and device: the per-row bookkeeping (tokens, log-probs, stop strings, seeds, finish reasons) lives on
the host; the device holds the model's inputs, the KV cache and the logits. Each decode step moves one
small tensor to the host (the sampled tokens and their log-probs, one synchronisation); everything the
host already knows (which rows are greedy or truncated, which finished) is never asked of the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from drmas.engines.base import SamplingParams
from drmas.engines.logprobs import left_pad
from drmas.engines.sampling import sample_tokens


@dataclass
class Row:
    """One request being generated (host side)."""

    request_id: str
    params: SamplingParams
    generator: torch.Generator | None  # the request's own stream when it has a seed
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    start: int = 0  # KV-cache column of its first prompt token
    alive: bool = True
    stopped: bool = False  # ended by EOS or a stop string (else by its length cap)
    matcher: Any = None  # its grammar's matcher under a constraint (drmas.engines.grammar)


class StopStrings:
    """Whether a row's response now holds one of its stop strings, decoding only a short tail of it.

    A stop string completed by the newest token lies within the last few tokens, so a tail window is
    enough. And a token can complete one only if its own text holds the stop string's last character (or
    is part of a multi-byte character), which most tokens do not: their check costs a dict lookup.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def hit(self, row: Row) -> bool:
        stops = row.params.stop
        if not stops:
            return False
        token = row.tokens[-1]
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        ends = [stop[-1] for stop in stops]
        # (a token decoded alone may lose a leading space: stop strings ending in whitespace are always checked)
        if not ("\ufffd" in text or any(end in text or end.isspace() for end in ends)):
            return False
        window = 4 * max(len(s) for s in stops) + 4  # a char is <= 4 UTF-8 bytes, a byte-level token >= 1
        tail = self.tokenizer.decode(row.tokens[-window:], skip_special_tokens=False)
        return any(stop in tail for stop in stops)


class DecodeBatch:
    """The rows being decoded together over one KV cache (see the module docstring)."""

    def __init__(self, model, pad_id: int, device: torch.device, adapters: bool = False) -> None:
        self.model = model
        self.adapters = adapters
        self.pad_id = pad_id
        self.device = device
        self.rows: list[Row] = []
        self.cache = None
        self.width = 0  # KV columns held
        self.logits: torch.Tensor | None = None  # [rows, vocab] to sample the next tokens from
        self._last: torch.Tensor | None = None  # [rows] tokens sampled last, fed at the next forward
        self._starts: torch.Tensor | None = None  # [rows] `Row.start` on the device
        self._temperature: torch.Tensor | None = None
        self._top_p: torch.Tensor | None = None
        self._padded = False
        self._greedy: list[bool] = []  # per row, known on the host: never asked of the device
        self._nucleus: list[bool] = []
        self._names: dict = {}  # the forward passes' `adapter_names` (rows' adapters), when serving adapters
        self._mergeable = True  # False for caches whose layers cannot be padded and joined (sliding windows)

    # ---- what the engine asks ----------------------------------------------------------------------

    @property
    def alive(self) -> int:
        return sum(row.alive for row in self.rows)

    @property
    def dead(self) -> int:
        return len(self.rows) - self.alive

    def can_join(self) -> bool:
        """Whether new rows may join now (a cache that cannot merge takes new rows only when empty)."""
        return self._mergeable or not self.rows

    # ---- rows in and out ----------------------------------------------------------------------------

    def join(self, prompts: Sequence[list[int]], rows: Sequence[Row]) -> None:
        """Prefill `prompts` (one per new row) and add their rows; finished rows are dropped first."""
        from transformers import DynamicCache

        self.compact()
        self.forward()  # the running rows' logits first: their cache is about to be padded
        ids, mask, positions = left_pad(prompts, self.pad_id)
        dev = self.device
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                         past_key_values=cache, use_cache=True, logits_to_keep=1, **self._adapter_names(rows))
        width = ids.shape[1]
        for row, prompt in zip(rows, prompts):
            row.start = width - len(prompt)
        logits = out.logits[:, -1]
        if not self.rows:
            self.cache, self.width, self.rows, self.logits = out.past_key_values, width, list(rows), logits
        else:
            self._merge(out.past_key_values, width, rows, logits)
        self._refresh()

    def _merge(self, cache, width: int, rows: Sequence[Row], logits: torch.Tensor) -> None:
        """Append prefilled rows (their cache `width` wide) to the running ones, padding the narrower side."""
        total = max(self.width, width)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([_pad_left(mine.keys, total), _pad_left(theirs.keys, total)])
            mine.values = torch.cat([_pad_left(mine.values, total), _pad_left(theirs.values, total)])
        for row in self.rows:
            row.start += total - self.width
        for row in rows:
            row.start += total - width
        self.logits = torch.cat([self.logits, logits])
        self.rows.extend(rows)
        self.width = total

    def compact(self, min_dead: int = 1) -> None:
        """Drop finished rows (one copy of the cache) once at least `min_dead` of them are in the batch, and
        the columns on the left that no live row uses."""
        if self.dead < max(min_dead, 1):
            return
        keep = [i for i, row in enumerate(self.rows) if row.alive]
        if not keep:
            self.clear()
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(index)
        if self.logits is not None:
            self.logits = self.logits[index]
        if self._last is not None:
            self._last = self._last[index]
        self.rows = [self.rows[i] for i in keep]
        cut = min(row.start for row in self.rows)
        if cut > 0 and self._mergeable:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, cut:], layer.values[:, :, cut:]
            for row in self.rows:
                row.start -= cut
            self.width -= cut
        self._refresh()

    def clear(self) -> None:
        self.rows, self.cache, self.width, self.logits, self._last = [], None, 0, None, None

    def _refresh(self) -> None:
        """Per-row device tensors after the rows changed (one small host-to-device copy each)."""
        from transformers.cache_utils import DynamicLayer

        dev = self.device
        self._starts = torch.tensor([row.start for row in self.rows], dtype=torch.long, device=dev)
        self._temperature = torch.tensor([r.params.temperature for r in self.rows], dtype=torch.float32, device=dev)
        self._top_p = torch.tensor([r.params.top_p for r in self.rows], dtype=torch.float32, device=dev)
        self._padded = any(row.start for row in self.rows)
        self._greedy = [r.params.temperature <= 0 for r in self.rows]
        self._nucleus = [r.params.top_p < 1.0 for r in self.rows]
        self._names = self._adapter_names(self.rows)
        self._mergeable = self.cache is None or all(type(layer) is DynamicLayer for layer in self.cache.layers)

    # ---- one decode step ----------------------------------------------------------------------------

    def forward(self) -> None:
        """Feed every row its last sampled token (one column more); the logits are then those of the next."""
        if self._last is None:
            return
        out = self.model(input_ids=self._last.unsqueeze(-1), attention_mask=self._decode_mask(),
                         position_ids=(self.width - self._starts).unsqueeze(-1),
                         past_key_values=self.cache, use_cache=True, **self._names)
        self.logits, self._last = out.logits[:, -1], None
        self.width += 1

    def _adapter_names(self, rows: Sequence[Row]) -> dict:
        """The forward pass's `adapter_names` for `rows` (peft's name of the bare base for a row of none)."""
        if not self.adapters:
            return {}
        return {"adapter_names": [row.params.adapter or "__base__" for row in rows]}

    def _decode_mask(self) -> torch.Tensor | None:
        """The attention mask of a decode step: none when no row is padded; with SDPA the 4D boolean mask
        itself (transformers would otherwise ask the device whether a 2D mask has padding: a sync per step);
        else the 2D padding mask."""
        if not self._padded:
            return None
        attend = torch.arange(self.width + 1, device=self.device).unsqueeze(0) >= self._starts.unsqueeze(1)
        if getattr(self.model.config, "_attn_implementation", None) == "sdpa":
            return attend[:, None, None, :]
        return attend.long()

    def sample(self, uniforms: Callable[[list[Row]], torch.Tensor]) -> list[tuple[int, float]]:
        """Sample one token for every row from the current logits; returns (token, log-prob) per row, read
        to the host in one transfer. `uniforms(rows)` gives one uniform per row on the device."""
        tokens, logprobs = sample_tokens(self.logits, self._temperature, self._top_p, uniforms(self.rows),
                                         greedy=self._greedy, nucleus=self._nucleus)
        self._last, self.logits = tokens, None
        pairs = torch.stack((tokens.to(torch.float64), logprobs.to(torch.float64))).tolist()
        return [(int(t), lp) for t, lp in zip(*pairs)]


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """`tensor` [batch, heads, columns, dim] with zero columns added on the left up to `width` columns."""
    missing = width - tensor.shape[2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros((tensor.shape[0], tensor.shape[1], missing, tensor.shape[3]))
    return torch.cat([pad, tensor], dim=2)
