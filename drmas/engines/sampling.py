"""Token sampling of the embedded engine: one token per row, and its log-prob under the full distribution.

The log-prob is always under the full tempered distribution ``softmax(logits / temperature)`` (before top-p
truncation), in float32: what the learner recomputes (`drmas.engines.logprobs`). Sampling is by inverse CDF
with one given uniform per row, so a row's draw depends only on its own uniform stream (per-request seeds
stay reproducible whatever else is in the batch).

Which rows are greedy or truncated is known on the host (their sampling parameters); callers pass it, so a
decode step never waits for the device to answer ``any()`` about tensors the host filled in itself.
"""

from __future__ import annotations

from typing import Sequence

import torch


def sample_tokens(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor,
    greedy: Sequence[bool] | None = None, nucleus: Sequence[bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return ``(tokens, logprobs)``.

    ``temperature`` 0 means greedy; the log-prob is then taken at temperature 1. ``greedy`` / ``nucleus``:
    per row, temperature <= 0 / top_p < 1, as the host knows them (asked of the tensors when not given).
    """
    greedy = [bool(g) for g in (temperature <= 0).tolist()] if greedy is None else list(greedy)
    nucleus = [bool(n) for n in (top_p < 1.0).tolist()] if nucleus is None else list(nucleus)
    logits = logits.float()
    scale = temperature.masked_fill(temperature <= 0, 1.0) if any(greedy) else temperature
    logp = torch.log_softmax(logits / scale.unsqueeze(-1), dim=-1)
    if all(greedy):
        tokens = logits.argmax(dim=-1)
    else:
        tokens = _sample_from(logp.exp(), top_p, uniforms, nucleus)
        if any(greedy):
            tokens = torch.where(temperature <= 0, logits.argmax(dim=-1), tokens)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _sample_from(probs: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor,
                 nucleus: Sequence[bool]) -> torch.Tensor:
    """Inverse-CDF sampling per row, with nucleus truncation only for the rows that ask for it (a sort is costly)."""
    if not any(nucleus):
        return _inverse_cdf(probs, uniforms)
    if all(nucleus):
        return _nucleus_sample(probs, top_p, uniforms)
    rows = torch.tensor(nucleus, dtype=torch.bool).to(probs.device, non_blocking=True)
    tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    tokens[~rows] = _inverse_cdf(probs[~rows], uniforms[~rows])
    tokens[rows] = _nucleus_sample(probs[rows], top_p[rows], uniforms[rows])
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
