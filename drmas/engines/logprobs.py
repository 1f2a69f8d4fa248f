"""Log-probabilities of given responses under a model: the quantity PPO's ratio is made of.

The engines record each sampled token's log-prob under ``softmax(logits / temperature)`` (the behaviour
policy); the learner recomputes the same quantity with the current weights via ``sequence_logprobs``. Both
sides must use the same definition — full distribution (no top-p truncation), float32, temperature 0
treated as 1 — or the importance ratios are biased. Keeping it in one module makes that contract visible.
"""

from __future__ import annotations

from typing import Sequence

import torch


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


def _temperatures(temperature: float | Sequence[float], rows: int) -> torch.Tensor:
    """Per-row effective temperatures as a float32 column broadcastable over [rows, tokens, vocab]."""
    values = [temperature] * rows if isinstance(temperature, (int, float)) else list(temperature)
    if len(values) != rows:
        raise ValueError(f"got {len(values)} temperatures for {rows} sequences")
    return torch.tensor([effective_temperature(t) for t in values], dtype=torch.float32).view(rows, 1, 1)


def sequence_logprobs(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float | Sequence[float] = 1.0,
    pad_id: int = 0,
) -> list[torch.Tensor]:
    """Log-prob of every response token given its prompt, at ``temperature`` (one value or one per row).

    One padded forward pass over prompt+response; gradients flow when grad mode is on (wrap the call in
    ``torch.no_grad()`` when they are not wanted). Only the last ``max_response_len + 1`` positions go
    through the LM head, so memory is ``rows x max_response_len x vocab`` floats, not the whole sequence.
    Returns one float32 tensor of length ``len(response)`` per row, on the model's device.
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(f"{len(prompt_ids_list)} prompts but {len(response_ids_list)} responses")
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")
    rows = len(prompt_ids_list)
    if rows == 0:
        return []
    longest = max(len(r) for r in response_ids_list)
    if longest == 0:
        return [torch.zeros(0) for _ in range(rows)]
    device = next(model.parameters()).device
    ids, mask, positions = left_pad([list(p) + list(r) for p, r in zip(prompt_ids_list, response_ids_list)], pad_id)
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        use_cache=False,
        logits_to_keep=longest + 1,
    )
    # Kept column k predicts column k+1, so the last column (predicting past the end) is dropped.
    logits = out.logits[:, :-1].float() / _temperatures(temperature, rows).to(device)
    logp = torch.log_softmax(logits, dim=-1)
    targets = ids[:, -longest:].to(device)  # responses are right-aligned in these columns
    token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return [token_logp[row, longest - len(r) :] for row, r in enumerate(response_ids_list)]
