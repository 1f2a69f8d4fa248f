"""The one message that crosses process boundaries: a `Sample` is one agent call of one episode.

It is a msgspec Struct so that it encodes to compact msgpack for the ZeroMQ buffer and decodes with
schema validation. `SCHEMA_VERSION` is bumped on any incompatible change; receivers reject other versions.

Values are constrained in the schema itself, so every decoder (the buffer's, the learner's) refuses them
in C while decoding, at no extra pass: rewards and log-probs must be finite (one NaN reward would poison a
learner's running statistics, one inf log-prob its importance weights), token ids non-negative, names
short. What only a model can know (its vocabulary, its positions) is checked by the learner
(`drmas.learner.sample_limits`).
"""

from __future__ import annotations

import re
from typing import Annotated, Optional

import msgspec

SCHEMA_VERSION = 1

# Reasons a sample is refused (buffer: `rejected/<reason>`; learner: `dropped/<model>/<reason>`).
REASON_NON_FINITE = "non_finite"
REASON_BAD_TOKEN = "bad_token"
REASON_TOO_LONG = "too_long"
REASON_INVALID = "invalid"

_FLOAT_MAX = 3.4e38  # float32's range: also the tightest bound that admits every finite value an engine makes
Finite = Annotated[float, msgspec.Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]  # NaN fails both comparisons
TokenId = Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
Name = Annotated[str, msgspec.Meta(max_length=256)]
MAX_VERSION = 2**31 - 1  # far beyond any run; keeps every counter derived from versions inside int64
Version = Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)]


class Sample(msgspec.Struct, kw_only=True, frozen=False):
    """One agent call (prompt -> response) with everything the learner needs to train on it."""

    schema_version: int = SCHEMA_VERSION
    episode_id: Name  # unique per episode (== trajectory id in GRPO terms)
    group_id: Name  # the prompt group: the n episodes of one task instance share it
    agent: Name  # agent name from the config (e.g. "solver")
    model: Name  # model id that served this call
    turn: int  # index of this call within the episode (0-based, across agents)
    prompt_ids: list[TokenId]
    response_ids: list[TokenId]
    behaviour_logprobs: list[Finite]  # log pi_behaviour(token) per response token, at `temperature`
    policy_version: Version  # version of the weights that produced the response tokens
    temperature: Finite  # sampling temperature the behaviour log-probs were computed at
    valid: bool  # whether the output followed the agent's required format
    reward: Finite = 0.0  # per-sample reward: episode reward minus the format penalty
    episode_reward: Finite = 0.0  # the shared task reward of the whole episode
    # the learner process that published `policy_version` ('' = initial weights or the colocated loop): a
    # learner resumed from a checkpoint numbers versions again from there, so the pair names the weights
    policy_incarnation: Name = ""


class SampleError(ValueError):
    """A sample that must not be trained on; `reason` is one of the REASON_* codes, for counting."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


_ENCODER = msgspec.msgpack.Encoder()
_SAMPLE_DECODER = msgspec.msgpack.Decoder(Sample)

# The field a msgspec validation error points at decides its reason code.
_FIELD_AT = re.compile(r"\.([a-z_]+)(?:\[\d+\])?`$")  # the last field of the error's path, e.g. `$.samples[0].reward`
_FIELD_REASONS = {
    "reward": REASON_NON_FINITE, "episode_reward": REASON_NON_FINITE, "behaviour_logprobs": REASON_NON_FINITE,
    "temperature": REASON_NON_FINITE, "prompt_ids": REASON_BAD_TOKEN, "response_ids": REASON_BAD_TOKEN,
}


def reason_of(error: Exception) -> str:
    """The counting code of a decode/validation error of a sample (REASON_INVALID unless a value rule)."""
    if isinstance(error, SampleError):
        return error.reason
    match = _FIELD_AT.search(str(error)) if isinstance(error, msgspec.ValidationError) else None
    return _FIELD_REASONS.get(match.group(1), REASON_INVALID) if match else REASON_INVALID


def encode_sample(sample: Sample) -> bytes:
    return _ENCODER.encode(sample)


def decode_sample(data: bytes, max_tokens: Optional[int] = None) -> Sample:
    """Decode and validate; raises `msgspec.DecodeError`/`ValueError` (a `SampleError` for a rule on values,
    see `reason_of`) on malformed or foreign data. With `max_tokens`, longer prompt + response is refused."""
    sample = _SAMPLE_DECODER.decode(data)
    check_sample(sample, max_tokens)
    return sample


def check_sample(sample: Sample, max_tokens: Optional[int] = None) -> None:
    """The rules a decoded sample must meet beyond its types (schema version, lengths that must agree)."""
    if sample.schema_version != SCHEMA_VERSION:
        raise ValueError(
            f"sample schema version {sample.schema_version} is not supported (expected {SCHEMA_VERSION})"
        )
    if len(sample.response_ids) != len(sample.behaviour_logprobs):
        raise SampleError(
            REASON_INVALID,
            f"sample {sample.episode_id}/{sample.turn}: {len(sample.response_ids)} response tokens but "
            f"{len(sample.behaviour_logprobs)} behaviour log-probs",
        )
    if not sample.prompt_ids:
        raise SampleError(REASON_INVALID, f"sample {sample.episode_id}/{sample.turn} has an empty prompt")
    n_tokens = len(sample.prompt_ids) + len(sample.response_ids)
    if max_tokens is not None and n_tokens > max_tokens:
        raise SampleError(
            REASON_TOO_LONG, f"sample {sample.episode_id}/{sample.turn} has {n_tokens} tokens > limit {max_tokens}"
        )
