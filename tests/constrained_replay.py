"""What a constrained reply's log-probs must be, recomputed apart from any engine: the model's logits at each
response position, every token the grammar does not allow there set to -inf (an xgrammar matcher replayed over the
response), `log_softmax(logits / T)` at the sampled token. The embedded and vLLM tests hold their engines to it."""

from __future__ import annotations

import torch
import xgrammar

from drmas.core.constraints import Constraint
from drmas.engines.grammar import Grammars

# a schema whose every value is short (an enum and a boolean): even a tiny random model completes it
VERDICT = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["approve", "reject"]},
                                            "sure": {"type": "boolean"}},
           "required": ["verdict", "sure"], "additionalProperties": False}


def constrained_logprobs(model, tokenizer, prompt: list[int], response: list[int], temperature: float,
                         constraint: Constraint, stop_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs under the constraint, log-probs without it) of `response` after `prompt`."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float()
    vocab = logits.shape[-1]
    grammars = Grammars(tokenizer, vocab, stop_ids)
    matcher = grammars.matcher(constraint)
    masked = logits.clone()
    bitmask = xgrammar.allocate_token_bitmask(len(response), vocab)
    for position, token in enumerate(response):
        matcher.fill_next_token_bitmask(bitmask, position)
        assert matcher.accept_token(token), f"token {token} at {position} is not allowed by the grammar"
    xgrammar.apply_token_bitmask_inplace(masked, bitmask)
    index = torch.tensor(response).unsqueeze(-1)
    under = torch.log_softmax(masked / temperature, dim=-1).gather(-1, index).squeeze(-1)
    free = torch.log_softmax(logits / temperature, dim=-1).gather(-1, index).squeeze(-1)
    return under, free
