"""Log-probabilities of given responses under a model: the quantity PPO's ratio is made of.

The engines record each sampled token's log-prob under ``softmax(logits / temperature)`` (the behaviour
policy); the learner recomputes the same quantity with the current weights via ``sequence_logprobs``. Both
sides must use the same definition — full distribution (no top-p truncation), float32, temperature 0
treated as 1 — or the importance ratios are biased. Keeping it in one module makes that contract visible.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from drmas.engines.fused_head import head_logprobs, plain_head


def effective_temperature(temperature: float) -> float:
    """The temperature the log-probs are taken at: greedy decoding (0) is scored at temperature 1."""
    return float(temperature) if temperature > 0 else 1.0


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad token id lists into ``(input_ids, attention_mask, position_ids)``.

    Left padding puts every sequence's end at the same column, so "the last k positions" are the same
    slice for all rows; position ids restart at 0 on each row's first real token so padding does not
    shift RoPE positions.
    """
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp_(min=0)
    return ids, mask, positions


def padded_response_logprobs(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    response_lengths: Sequence[int],
    temperatures: Sequence[float],
) -> list[torch.Tensor]:
    """The one computation behind both sides of the contract: a left-padded batch of prompt + response (as
    `left_pad` makes it, responses right-aligned) -> the log-prob of every response token at its row's
    effective temperature.

    Only the last ``max_response_len + 1`` positions go through the LM head, and the log-softmax over the
    vocabulary runs over ``LOGSOFTMAX_CHUNK_BYTES`` of them at a time (`token_logprobs`), so the memory is the
    head's ``rows x max_response_len x vocab`` logits and one chunk, not several whole copies of them. A
    training pass with activation checkpointing, on a model whose head is a plain linear layer, fuses the head
    into the chunks too (`drmas.engines.fused_head`): one chunk of logits at a time, forward and backward.
    Gradients flow when grad mode is on. Returns one float32 tensor of length ``response_lengths[row]`` per
    row, on the model's device.
    """
    rows = ids.shape[0]
    if len(response_lengths) != rows or len(temperatures) != rows:
        raise ValueError(f"{rows} rows but {len(response_lengths)} response lengths and {len(temperatures)} temperatures")
    device = next(model.parameters()).device
    longest = max(response_lengths, default=0)
    if longest == 0:
        return [torch.zeros(0, device=device) for _ in range(rows)]
    ids = ids.to(device)
    # kept column k predicts column k+1; the last predicts past the end (its target is a dummy, dropped below)
    targets = torch.nn.functional.pad(ids[:, -longest:], (0, 1))
    temps = [effective_temperature(t) for t in temperatures]
    inputs = dict(input_ids=ids, attention_mask=mask.to(device), position_ids=positions.to(device), use_cache=False)
    recompute = getattr(model, "is_gradient_checkpointing", False)  # models.<id>.activation_checkpointing
    fused = plain_head(model) if recompute and torch.is_grad_enabled() else None
    if fused is not None:  # the learner's training pass: head and log-softmax fused per chunk (drmas.engines.fused_head)
        decoder, weight = fused
        hidden = decoder(**inputs).last_hidden_state[:, -(longest + 1) :]
        token_logp = fused_token_logprobs(hidden, weight, targets, temps)[:, :-1]
    else:
        out = model(**inputs, logits_to_keep=longest + 1)
        token_logp = token_logprobs(out.logits, targets, temps, recompute)[:, :-1]
    return [token_logp[row, longest - n :] for row, n in enumerate(response_lengths)]


LOGSOFTMAX_CHUNK_BYTES = 32 << 20  # float32 logits per log-softmax chunk: tens of MB, whatever the batch


def _chunk_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """log softmax(logits / temperature)[target] of each (position, vocabulary) row: the contract's definition."""
    logits = logits.float()
    if temperature is not None:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperatures: Sequence[float],
                   recompute: bool = True) -> torch.Tensor:
    """``rows x positions`` log-probs of ``targets`` under ``logits`` (``rows x positions x vocab``) at each row's
    temperature, computed over a few thousand positions at a time.

    Why chunks: the log-softmax of all positions at once makes whole-size copies of the logits (float32 cast,
    temperature, log-softmax output kept for the backward, and as many gradients), several times the logits
    themselves. Per chunk, each piece is made, used and freed; with gradients each chunk is checkpointed, so
    its log-softmax is recomputed in the backward instead of kept (``recompute``; `padded_response_logprobs`
    recomputes when the model's layers do, i.e. with ``models.<id>.activation_checkpointing``). The values are
    those of the whole-tensor computation: every position's log-softmax is computed alone either way."""
    rows, width, vocab = logits.shape
    flat, flat_targets = logits.reshape(rows * width, vocab), targets.reshape(rows * width)
    temps = _row_temperatures(temperatures, width, logits.device)
    step = _chunk_positions(vocab)
    grad = recompute and torch.is_grad_enabled() and logits.requires_grad
    pieces = []
    for start, (part, part_targets) in enumerate(zip(flat.split(step), flat_targets.split(step))):
        part_temps = None if temps is None else temps[start * step : start * step + len(part)]
        if grad:
            pieces.append(checkpoint(_chunk_logprobs, part, part_targets, part_temps, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(part, part_targets, part_temps))
    return torch.cat(pieces).view(rows, width)


def _chunk_positions(vocab: int) -> int:
    """Positions per chunk: ``LOGSOFTMAX_CHUNK_BYTES`` of float32 logits over `vocab`, at least one."""
    return max(1, LOGSOFTMAX_CHUNK_BYTES // (4 * vocab))


def _row_temperatures(temperatures: Sequence[float], width: int, device: torch.device) -> torch.Tensor | None:
    """Each row's temperature repeated over its `width` positions, as a column; None where all are 1 (dividing
    by 1 is exact: the pass over the logits is skipped)."""
    if all(t == 1.0 for t in temperatures):
        return None
    return torch.tensor(temperatures, dtype=torch.float32, device=device).repeat_interleave(width)[:, None]


def fused_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         temperatures: Sequence[float]) -> torch.Tensor:
    """`token_logprobs` of the head `weight` applied to `hidden` (``rows x positions x hidden``), the head and the
    log-softmax fused per chunk of ``LOGSOFTMAX_CHUNK_BYTES`` of logits (`drmas.engines.fused_head`)."""
    rows, width, _ = hidden.shape
    step = _chunk_positions(weight.shape[0])
    temps = _row_temperatures(temperatures, width, hidden.device)
    return head_logprobs(hidden.reshape(rows * width, -1), weight, targets.reshape(rows * width), temps,
                         step).view(rows, width)


def sequence_logprobs(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float | Sequence[float] = 1.0,
    pad_id: int = 0,
) -> list[torch.Tensor]:
    """Log-prob of every response token given its prompt, at ``temperature`` (one value or one per row).

    One padded forward pass over prompt+response (`padded_response_logprobs`); gradients flow when grad
    mode is on (wrap the call in ``torch.no_grad()`` when they are not wanted). Returns one float32 tensor of
    length ``len(response)`` per row, on the model's device.
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(f"{len(prompt_ids_list)} prompts but {len(response_ids_list)} responses")
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")
    rows = len(prompt_ids_list)
    if rows == 0:
        return []
    temperatures = [temperature] * rows if isinstance(temperature, (int, float)) else list(temperature)
    if len(temperatures) != rows:
        raise ValueError(f"got {len(temperatures)} temperatures for {rows} sequences")
    if max(len(r) for r in response_ids_list) == 0:
        device = next(model.parameters()).device
        return [torch.zeros(0, device=device) for _ in range(rows)]
    ids, mask, positions = left_pad([list(p) + list(r) for p, r in zip(prompt_ids_list, response_ids_list)], pad_id)
    return padded_response_logprobs(model, ids, mask, positions, [len(r) for r in response_ids_list], temperatures)
