"""The one message that crosses process boundaries: a `Sample` is one agent call of one episode.

It is a msgspec Struct so that it encodes to compact msgpack for the ZeroMQ buffer and decodes with
schema validation. `SCHEMA_VERSION` is bumped on any incompatible change; receivers reject other versions.

Token ids and behaviour log-probs are numpy arrays (int32, float32) that travel packed (`drmas.core.packed`):
decoding a sample of 32k tokens is a few zero-copy views, not 64k Python objects. Scalars are constrained
in the schema itself, so every decoder refuses them in C while decoding: rewards must be finite (one NaN
reward would poison a learner's running statistics), names short. The arrays are checked by
`check_sample` in a few vectorised passes: log-probs finite (one inf would poison the importance
weights), token ids non-negative (int32 bounds them below 2**31). What only a model can know (its
vocabulary, its positions) is checked by the learner (`drmas.learner.sample_limits`).

Schema 2 made the arrays packed; a schema-1 sender (lists) is refused with both versions named.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Optional

import msgspec
import numpy as np

from drmas.core.packed import FLOAT32, INT32, decoder, encoder, float_values, is_packed, token_ids

SCHEMA_VERSION = 2

# Reasons a sample is refused (buffer: `rejected/<reason>`; learner: `dropped/<model>/<reason>`).
REASON_NON_FINITE = "non_finite"
REASON_BAD_TOKEN = "bad_token"
REASON_TOO_LONG = "too_long"
REASON_INVALID = "invalid"

_FLOAT_MAX = 3.4e38  # float32's range: also the tightest bound that admits every finite value an engine makes
Finite = Annotated[float, msgspec.Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]  # NaN fails both comparisons
Name = Annotated[str, msgspec.Meta(max_length=256)]
MAX_VERSION = 2**31 - 1  # far beyond any run; keeps every counter derived from versions inside int64
Version = Annotated[int, msgspec.Meta(ge=0, le=MAX_VERSION)]


def storable(value: float) -> bool:
    """Whether a number survives the wire (what `Finite` admits: finite and within float32's range). Whatever
    takes a reward from outside (an orchestra's outcome, the gateway's HTTP body) checks it with this, so a
    value the buffer would refuse, costing its whole group, is refused where it enters instead."""
    return -_FLOAT_MAX <= value <= _FLOAT_MAX  # NaN fails both comparisons


STORABLE = f"a finite number within float32's range (|x| <= {_FLOAT_MAX:g})"


class Sample(msgspec.Struct, kw_only=True, frozen=False):
    """One agent call (prompt -> response) with everything the learner needs to train on it."""

    schema_version: int = SCHEMA_VERSION
    episode_id: Name  # unique per episode (== trajectory id in GRPO terms)
    group_id: Name  # the prompt group: the n episodes of one task instance share it
    agent: Name  # agent name from the config (e.g. "solver")
    model: Name  # model id that served this call
    turn: int  # index of this call within the episode (0-based, across agents)
    prompt_ids: np.ndarray  # int32 token ids (lists are converted on construction and assignment)
    response_ids: np.ndarray  # int32 token ids
    behaviour_logprobs: np.ndarray  # float32 log pi_behaviour(token) per response token, at `temperature`
    policy_version: Version  # version of the weights that produced the response tokens
    temperature: Finite  # sampling temperature the behaviour log-probs were computed at
    valid: bool  # whether the output followed the agent's required format
    reward: Finite = 0.0  # per-sample reward: the turn's reward (episode, agent or turn) minus the format penalty
    episode_reward: Finite = 0.0  # the shared task reward of the whole episode
    # the learner process that published `policy_version` ('' = initial weights or the colocated loop): a
    # learner resumed from a checkpoint numbers versions again from there, so the pair names the weights
    policy_incarnation: Name = ""

    def __post_init__(self) -> None:
        """Arrays of the wire's types, whether built from lists here or decoded (then already, no copy)."""
        if (is_packed(self.prompt_ids, INT32) and is_packed(self.response_ids, INT32)
                and is_packed(self.behaviour_logprobs, FLOAT32)):
            return  # decoded: runs for every sample every hop decodes, so it does nothing it need not
        set_field = super().__setattr__
        set_field("prompt_ids", token_ids(self.prompt_ids, "prompt_ids"))
        set_field("response_ids", token_ids(self.response_ids, "response_ids"))
        set_field("behaviour_logprobs", float_values(self.behaviour_logprobs, "behaviour_logprobs"))

    def __setattr__(self, name: str, value: object) -> None:
        """Assigning a list to an array field converts it, as construction does."""
        convert = _ARRAY_FIELDS.get(name)
        super().__setattr__(name, value if convert is None else convert(value, name))

    def __eq__(self, other: object) -> bool:
        """Field by field, arrays by value and dtype (numpy's `==` is elementwise, not a truth value)."""
        if type(other) is not Sample:
            return NotImplemented
        for name in self.__struct_fields__:
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in _ARRAY_FIELDS:
                if mine.dtype != theirs.dtype or not np.array_equal(mine, theirs):
                    return False
            elif mine != theirs:
                return False
        return True

    __hash__ = None  # mutable, and compared by value


_ARRAY_FIELDS = {"prompt_ids": token_ids, "response_ids": token_ids, "behaviour_logprobs": float_values}


class SampleError(ValueError):
    """A sample that must not be trained on; `reason` is one of the REASON_* codes, for counting."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class _SampleVersion(msgspec.Struct):
    """The one field every sample schema has; read only to explain why a full decode failed."""

    schema_version: int = -1


_sum = np.add.reduce  # the ufunc reduction, without ndarray.sum's Python wrapper
_ENCODER = encoder()
_SAMPLE_DECODER = decoder(Sample)
_VERSION_DECODER = msgspec.msgpack.Decoder(_SampleVersion)

# The field a msgspec validation error points at decides its reason code.
_FIELD_AT = re.compile(r"\.([a-z_]+)(?:\[\d+\])?`$")  # the last field of the error's path, e.g. `$.samples[0].reward`
_FIELD_REASONS = {
    "reward": REASON_NON_FINITE, "episode_reward": REASON_NON_FINITE, "temperature": REASON_NON_FINITE,
}  # array fields are checked by `check_sample` (SampleError); a ValidationError there is a malformed array


def reason_of(error: Exception) -> str:
    """The counting code of a decode/validation error of a sample (REASON_INVALID unless a value rule)."""
    if isinstance(error, SampleError):
        return error.reason
    match = _FIELD_AT.search(str(error)) if isinstance(error, msgspec.ValidationError) else None
    return _FIELD_REASONS.get(match.group(1), REASON_INVALID) if match else REASON_INVALID


def encode_sample(sample: Sample) -> bytes:
    return _ENCODER.encode(sample)


def decode_sample(data: bytes, max_tokens: Optional[int] = None, check: bool = True) -> Sample:
    """Decode and validate; raises `msgspec.DecodeError`/`ValueError` (a `SampleError` for a rule on values,
    see `reason_of`) on malformed or foreign data. With `max_tokens`, longer prompt + response is refused.

    `check=False` skips `check_sample`'s value rules (types and scalar bounds are still enforced by the
    decode): for bytes a trusted peer already checked, such as samples the buffer validated in full."""
    try:
        sample = _SAMPLE_DECODER.decode(data)
    except (msgspec.DecodeError, ValueError):
        _check_version(_peek_version(data))  # a foreign version explains the failure best
        raise
    if check:
        check_sample(sample, max_tokens)
    else:
        _check_version(sample.schema_version)
    return sample


def _peek_version(data: bytes) -> int:
    try:
        return _VERSION_DECODER.decode(data).schema_version
    except (msgspec.DecodeError, ValueError, RecursionError):
        return SCHEMA_VERSION  # unreadable: the original error says more than a version could


def _check_version(version: int) -> None:
    if version != SCHEMA_VERSION:
        raise ValueError(f"sample schema version {version} is not supported (expected {SCHEMA_VERSION}; "
                         "schema 2 carries token ids and log-probs as packed arrays)")


def check_sample(sample: Sample, max_tokens: Optional[int] = None) -> None:
    """The rules a decoded sample must meet beyond its types (schema version, lengths that must agree, ids
    non-negative, log-probs finite), each a vectorised pass over the arrays."""
    _check_version(sample.schema_version)
    if len(sample.response_ids) != len(sample.behaviour_logprobs):
        raise SampleError(
            REASON_INVALID,
            f"sample {sample.episode_id}/{sample.turn}: {len(sample.response_ids)} response tokens but "
            f"{len(sample.behaviour_logprobs)} behaviour log-probs",
        )
    if not len(sample.prompt_ids):
        raise SampleError(REASON_INVALID, f"sample {sample.episode_id}/{sample.turn} has an empty prompt")
    n_tokens = len(sample.prompt_ids) + len(sample.response_ids)
    if max_tokens is not None and n_tokens > max_tokens:
        raise SampleError(
            REASON_TOO_LONG, f"sample {sample.episode_id}/{sample.turn} has {n_tokens} tokens > limit {max_tokens}"
        )
    # the cheapest passes numpy has (every hop checks every sample): argmin has a fraction of the ufunc
    # machinery's fixed cost, which dominates at the usual lengths
    prompt, response, logprobs = sample.prompt_ids, sample.response_ids, sample.behaviour_logprobs
    if prompt[prompt.argmin()] < 0 or (len(response) and response[response.argmin()] < 0):
        raise SampleError(REASON_BAD_TOKEN, f"sample {sample.episode_id}/{sample.turn} has a negative token id")
    # any NaN or inf makes the dot product non-finite; so can float32 overflow of large finite values, which the
    # exact float64 sum then tells apart (finite float32 values, <= 3.4e38, cannot overflow it)
    if not math.isfinite(logprobs.dot(logprobs)) and not math.isfinite(_sum(logprobs, None, np.float64)):
        raise SampleError(REASON_NON_FINITE, f"sample {sample.episode_id}/{sample.turn} has a non-finite log-prob")
