"""Packed sample arrays: round trips of every array type and length, and refusal of the previous schema."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from buffer_harness import clients, episode, make_buffer  # noqa: F401  (fixtures)

from drmas.buffer.framing import decode_message, encode_frames
from drmas.buffer.messages import MESSAGE_SCHEMA_VERSION, EpisodeMsg
from drmas.core.sample import (
    REASON_BAD_TOKEN,
    REASON_INVALID,
    REASON_NON_FINITE,
    SCHEMA_VERSION,
    Sample,
    SampleError,
    decode_sample,
    encode_sample,
    reason_of,
)


def _sample(prompt, response, logprobs) -> Sample:
    return Sample(episode_id="e", group_id="g", agent="solver", model="m1", turn=0, prompt_ids=prompt,
                  response_ids=response, behaviour_logprobs=logprobs, policy_version=3, temperature=0.7,
                  valid=True, reward=1.5)


@pytest.mark.parametrize("n_prompt,n_response", [(1, 0), (1, 1), (7, 3), (32_768, 32_768)])
@pytest.mark.parametrize("source", ["list", "int64", "int32"])
def test_packed_samples_round_trip_as_int32_and_float32_views(n_prompt, n_response, source) -> None:
    rng = np.random.default_rng(n_prompt + n_response)
    prompt = rng.integers(0, 2**31 - 1, n_prompt)
    response = rng.integers(0, 2**31 - 1, n_response)
    logprobs = -rng.random(n_response)  # float64: stored as float32
    if source == "list":
        prompt, response, logprobs = prompt.tolist(), response.tolist(), logprobs.tolist()
    elif source == "int32":
        prompt, response, logprobs = prompt.astype(np.int32), response.astype(np.int32), logprobs.astype(np.float32)
    sample = _sample(prompt, response, logprobs)
    data = encode_sample(sample)
    assert len(data) < 8 * (n_prompt + 2 * n_response) + 300  # 4 bytes an element, plus the fields
    decoded = decode_sample(data)
    assert decoded == sample
    assert decoded.prompt_ids.dtype == np.int32 and decoded.behaviour_logprobs.dtype == np.float32
    assert decoded.prompt_ids.tolist() == list(prompt) and decoded.response_ids.tolist() == list(response)
    np.testing.assert_array_equal(decoded.behaviour_logprobs, np.asarray(logprobs, dtype=np.float32))
    assert not decoded.prompt_ids.flags.writeable  # a view of the received bytes, not a copy


def test_messages_carry_packed_samples_and_arrays_compare_by_value() -> None:
    samples = episode("g", 0)[1]
    message = EpisodeMsg(producer="p", seq=1, group_id="g", group_size=1, episode_id="g/e0", samples=samples)
    decoded = decode_message(encode_frames(message))
    assert decoded == message
    decoded.samples[0].response_ids = [4, 6]  # assignment converts, as construction does
    assert decoded.samples[0].response_ids.dtype == np.int32 and decoded != message


def test_array_rules_are_refused_with_their_reason_code() -> None:
    cases = {
        REASON_BAD_TOKEN: _sample([1, -2], [3], [-0.1]),
        REASON_NON_FINITE: _sample([1], [3, 4], [-0.1, math.nan]),
        REASON_INVALID: _sample([1], [3, 4], [-0.1]),
    }
    for reason, sample in cases.items():
        with pytest.raises(SampleError) as error:
            decode_sample(encode_sample(sample))
        assert reason_of(error.value) == reason
    with pytest.raises(ValueError, match="outside int32"):
        _sample([2**31], [], [])
    with pytest.raises(TypeError, match="integer token ids"):
        _sample([1.5], [], [])
    with pytest.raises(SampleError, match="empty prompt"):
        decode_sample(encode_sample(_sample([], [], [])))


def _schema_1_sample() -> dict:
    """A sample as drmas before packed arrays sent it: lists of numbers."""
    return {"schema_version": 1, "episode_id": "g/e0", "group_id": "g", "agent": "solver", "model": "m1", "turn": 0,
            "prompt_ids": [1, 2, 3], "response_ids": [4, 5], "behaviour_logprobs": [-0.5, -0.25],
            "policy_version": 0, "temperature": 1.0, "valid": True}


def test_a_sample_of_the_previous_schema_is_refused_naming_both_versions() -> None:
    with pytest.raises(ValueError, match=f"sample schema version 1 is not supported .expected {SCHEMA_VERSION}"):
        decode_sample(msgspec.msgpack.encode(_schema_1_sample()))


def test_peers_of_the_previous_protocol_are_refused_with_a_message(make_buffer, clients) -> None:
    """Schema 2 sent samples inside the episode's one frame (and pulls got one frame back): such a producer and
    such a learner are both told to upgrade, not left guessing at garbage."""
    buf = make_buffer()
    producer = clients.raw(buf.producer_endpoint)
    sample = msgspec.Raw(encode_sample(episode("g", 0, agents=("solver",))[1][0]))  # sample schema 2, packed
    producer.send(msgspec.msgpack.encode({"type": "EpisodeMsg", "schema_version": MESSAGE_SCHEMA_VERSION - 1,
                                          "producer": "old", "seq": 5, "group_id": "g", "group_size": 1,
                                          "episode_id": "g/e0", "samples": [sample]}))
    learner = clients.raw(buf.consumer_endpoint)
    learner.send(msgspec.msgpack.encode({"type": "Pull", "schema_version": MESSAGE_SCHEMA_VERSION - 1, "seq": 6,
                                         "agents": ["solver"]}))
    for sock, seq in ((producer, 5), (learner, 6)):
        assert sock.poll(5000)
        reply = decode_message(sock.recv_multipart())
        assert (reply.seq, reply.accepted, reply.reason) == (seq, False, "schema_version")
        assert f"message schema {MESSAGE_SCHEMA_VERSION - 1}, expected {MESSAGE_SCHEMA_VERSION}" in reply.detail
        assert "older drmas" in reply.detail and "frame of its own" in reply.detail
    assert buf.stats().rejected == {"schema_version": 2}
