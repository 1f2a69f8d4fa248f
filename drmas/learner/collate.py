"""Learner-side collation: samples' packed arrays into padded tensors by whole-row copies, never per element.

Samples arrive as int32/float32 numpy views (`drmas.core.packed`). Building a batch from them one Python number
at a time (what `torch.tensor(list)` does) cost milliseconds per 32k-token sample; here each row is one
numpy slice assignment into a preallocated array, then one `torch.from_numpy` and one transfer.

`response_logprobs` is the learner's side of the contract in `drmas.engines.logprobs`: the batch is collated
here, and the log-probs come from the same `padded_response_logprobs` that `sequence_logprobs` uses.
`tests/test_policy.py` checks that both agree.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from drmas.core.sample import Sample
from drmas.engines.logprobs import padded_response_logprobs


def left_padded(samples: Sequence[Sample], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) of prompt + response per row, left-padded (int64, CPU).

    Left padding puts every row's end in the same column, so the responses are the last columns."""
    lengths = np.array([len(s.prompt_ids) + len(s.response_ids) for s in samples], dtype=np.int64)
    width = int(lengths.max())
    ids = np.full((len(samples), width), pad_id, dtype=np.int64)
    for row, sample in enumerate(samples):
        split = width - len(sample.response_ids)
        ids[row, split - len(sample.prompt_ids) : split] = sample.prompt_ids
        ids[row, split:] = sample.response_ids
    mask = np.arange(width)[None, :] >= (width - lengths)[:, None]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64)), torch.from_numpy(positions)


def float_rows(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """One float32 tensor per array on `device`, made by one concatenation and one transfer."""
    if not arrays:
        return []
    flat = torch.from_numpy(np.concatenate(arrays).astype(np.float32, copy=False)).to(device)
    return list(torch.split(flat, [len(a) for a in arrays]))


def response_logprobs(model: torch.nn.Module, samples: Sequence[Sample], pad_id: int = 0) -> list[torch.Tensor]:
    """Log-prob of every response token of each sample given its prompt, at the sample's temperature.

    Gradients flow when grad mode is on. Returns one float32 tensor of length `len(response_ids)` per
    sample, on the model's device."""
    if any(len(s.prompt_ids) == 0 for s in samples):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")
    if max((len(s.response_ids) for s in samples), default=0) == 0:
        device = next(model.parameters()).device
        return [torch.zeros(0, device=device) for _ in samples]
    ids, mask, positions = left_padded(samples, pad_id)
    return padded_response_logprobs(model, ids, mask, positions, [len(s.response_ids) for s in samples],
                                    [s.temperature for s in samples])
