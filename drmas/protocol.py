"""The one message that crosses process boundaries: a `Sample` is one agent call of one episode.

It is a msgspec Struct so that it encodes to compact msgpack for the ZeroMQ buffer and decodes with
schema validation. `SCHEMA_VERSION` is bumped on any incompatible change; receivers reject other versions.
"""

from __future__ import annotations

import msgspec

SCHEMA_VERSION = 1


class Sample(msgspec.Struct, kw_only=True, frozen=False):
    """One agent call (prompt -> response) with everything the learner needs to train on it."""

    schema_version: int = SCHEMA_VERSION
    episode_id: str  # unique per episode (== trajectory id in GRPO terms)
    group_id: str  # the prompt group: the n episodes of one task instance share it
    agent: str  # agent name from the config (e.g. "solver")
    model: str  # model id that served this call
    turn: int  # index of this call within the episode (0-based, across agents)
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]  # log pi_behaviour(token) per response token, at `temperature`
    policy_version: int  # version of the weights that produced the response tokens
    temperature: float  # sampling temperature the behaviour log-probs were computed at
    valid: bool  # whether the output followed the agent's required format
    reward: float = 0.0  # per-sample reward: episode reward minus the format penalty
    episode_reward: float = 0.0  # the shared task reward of the whole episode
    # the learner process that published `policy_version` ('' = initial weights or the colocated loop): a
    # learner resumed from a checkpoint numbers versions again from there, so the pair names the weights
    policy_incarnation: str = ""


_ENCODER = msgspec.msgpack.Encoder()
_SAMPLE_DECODER = msgspec.msgpack.Decoder(Sample)


def encode_sample(sample: Sample) -> bytes:
    return _ENCODER.encode(sample)


def decode_sample(data: bytes) -> Sample:
    """Decode and validate; raises `msgspec.DecodeError`/`ValueError` on malformed or foreign data."""
    sample = _SAMPLE_DECODER.decode(data)
    if sample.schema_version != SCHEMA_VERSION:
        raise ValueError(
            f"sample schema version {sample.schema_version} is not supported (expected {SCHEMA_VERSION})"
        )
    if len(sample.response_ids) != len(sample.behaviour_logprobs):
        raise ValueError(
            f"sample {sample.episode_id}/{sample.turn}: {len(sample.response_ids)} response tokens but "
            f"{len(sample.behaviour_logprobs)} behaviour log-probs"
        )
    return sample
