"""What a learner's model can take: a sample outside it is dropped before it reaches the model.

The buffer already refuses what the wire format can rule out (non-finite rewards and log-probs, negative
token ids, more than `pipeline.buffer.max_sample_tokens` tokens). Two limits only the model knows: token
ids must index its embedding table (an id past it raised IndexError deep inside the forward pass and ended
the learner), and prompt + response must fit its positions (a 20k-token prompt took a learner to 24 GB and
the OOM killer). The values are checked here again because a buffer may run with `validate_samples=false`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from drmas.core.sample import REASON_BAD_TOKEN, REASON_INVALID, REASON_NON_FINITE, REASON_TOO_LONG, Sample


@dataclass(frozen=True)
class SampleLimits:
    vocab_size: int  # rows of the input embedding: every token id must be below it
    max_tokens: Optional[int]  # prompt + response; None = no limit known

    @classmethod
    def of_model(cls, model: torch.nn.Module, configured_max: Optional[int] = None) -> "SampleLimits":
        """The limits of `model`: its embedding rows and the smaller of its positions and `configured_max`."""
        vocab = model.get_input_embeddings().num_embeddings
        positions = getattr(model.config, "max_position_embeddings", None)
        limits = [n for n in (positions, configured_max) if isinstance(n, int) and n > 0]
        return cls(vocab_size=vocab, max_tokens=min(limits) if limits else None)

    def violation(self, sample: Sample) -> Optional[str]:
        """The reason code why `sample` cannot be trained on by this model, or None."""
        n_tokens = len(sample.prompt_ids) + len(sample.response_ids)
        if self.max_tokens is not None and n_tokens > self.max_tokens:
            return REASON_TOO_LONG
        for ids in (sample.prompt_ids, sample.response_ids):  # int32 arrays: two reductions each
            if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
                return REASON_BAD_TOKEN
        logprob_sum = float(sample.behaviour_logprobs.sum(dtype=np.float64))
        values = (sample.reward, sample.episode_reward, sample.temperature, logprob_sum)
        if not all(math.isfinite(v) for v in values):  # a NaN or an inf anywhere makes the sum non-finite
            return REASON_NON_FINITE
        if sample.temperature <= 0:  # log-probs are computed at logits / temperature
            return REASON_INVALID
        return None
