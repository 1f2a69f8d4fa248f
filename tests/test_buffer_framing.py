"""Message schema 3 on the wire: samples in frames (large ones alone, small ones joined), batched acks."""

from __future__ import annotations

import numpy as np
import zmq
from buffer_harness import clients, conserved, episode, make_buffer, make_sample, replies  # noqa: F401  (fixtures)
from buffer_harness import settle_acks

from drmas.buffer.framing import (
    OWN_FRAME_BYTES,
    decode_client_reply,
    decode_message,
    encode_frames,
    open_group,
)
from drmas.buffer.messages import AgentGroup, EpisodeMsg, GroupBatch, Pull, encode_message
from drmas.core.sample import Sample, encode_sample


def _sample(group: str, episode_id: str, n_prompt: int, n_response: int, seed: int) -> Sample:
    rng = np.random.default_rng(seed)
    sample = make_sample(group, episode_id, "solver")
    sample.prompt_ids = rng.integers(0, 50_000, n_prompt)
    sample.response_ids = rng.integers(0, 50_000, n_response)
    sample.behaviour_logprobs = -rng.random(n_response)
    return sample


def test_batches_round_trip_with_large_samples_alone_and_small_ones_joined() -> None:
    large = 20_000  # 80 KB of prompt ids: over the threshold, so a frame of its own
    sizes = [(3, 0), (large, 5), (7, 2), (5, 5), (large, large), (1, 1)]  # an empty response first
    groups = [AgentGroup(group_id="g", agent="solver", model="m1", episode_scores={"e0": 1.0}, group_rewards=[1.0],
                         samples=[_sample("g", f"e{i}", p, r, seed=i) for i, (p, r) in enumerate(sizes)]),
              AgentGroup(group_id="empty", agent="solver", model="m1", samples=[], episode_scores={}),
              AgentGroup(group_id="many", agent="verifier", model="m2", episode_scores={}, group_rewards=[0.5] * 300,
                         samples=[_sample("many", f"e{i}", 4, 3, seed=i) for i in range(300)])]
    batch = GroupBatch(seq=7, groups=groups, instance="abc")
    frames = encode_frames(batch)
    # head | 1 small | large | 2 small joined | large | the last small of g and all 300 of `many`, joined
    small, many = [encode_sample(s) for s in groups[0].samples], [encode_sample(s) for s in groups[2].samples]
    assert frames[1:] == [small[0], small[1], small[2] + small[3], small[4], b"".join([small[5], *many])]
    assert [len(f) >= OWN_FRAME_BYTES for f in frames[1:5]] == [False, True, False, True]
    assert decode_message(frames) == batch
    assert decode_message(encode_frames(GroupBatch(seq=8, groups=[]))) == GroupBatch(seq=8, groups=[])

    # the learner's path: groups opened one by one, arrays are views of the received frames
    view = decode_client_reply(frames)
    opened = [open_group(group) for group in view.groups]
    assert opened == groups
    assert not opened[0].samples[1].prompt_ids.flags.writeable


def test_episode_frames_that_do_not_add_up_are_refused() -> None:
    samples = [_sample("g", "g/e0", 3, 2, 0), _sample("g", "g/e0", 4, 1, 1)]
    frames = encode_frames(EpisodeMsg(producer="p", seq=1, group_id="g", group_size=1, episode_id="g/e0",
                                      samples=samples))
    assert len(frames) == 2 and len(frames[1]) == sum(len(encode_sample(s)) for s in samples)
    assert decode_message(frames).samples == samples
    for broken in ([frames[0], frames[1][:-1]], [frames[0], frames[1], b"\x80"], frames[:1]):
        try:
            decode_message(broken)
        except ValueError as exc:
            assert exc.reason == "bad_framing", exc
        else:
            raise AssertionError("frames that do not hold the announced samples were accepted")


def test_mixed_sizes_pass_the_buffer_unchanged_and_episodes_are_acked_in_batches(make_buffer, clients) -> None:
    buf = make_buffer(agent_models={"solver": "m1"})
    producer, learner = clients.producer(buf, window=16), clients.consumer(buf)
    sent = []
    for index in range(4):  # a large sample and a small one in each episode
        episode_id = f"g/e{index}"
        samples = [_sample("g", episode_id, 30_000, 100, seed=2 * index), _sample("g", episode_id, 5, 0, 2 * index + 1)]
        producer.send_episode("g", 4, episode_id, samples)
        sent += samples
    producer.flush()
    (group,) = learner.pull(["solver"], max_groups=1, wait_ms=1000)
    assert group.samples == sent

    raw = clients.raw(buf.producer_endpoint)  # 20 episodes sent before reading any answer
    for seq in range(20):
        episode_id, samples = episode(f"h{seq}", 0, agents=("solver",))
        raw.send_multipart(encode_frames(EpisodeMsg(producer="raw", seq=seq, group_id=f"h{seq}", group_size=1,
                                                    episode_id=episode_id, samples=samples)))
    answers = replies(raw, 20)
    assert sorted(a.seq for a in answers) == list(range(20)) and all(a.accepted for a in answers)
    assert not raw.poll(200)  # each acknowledged exactly once
    stats = buf.stats()
    assert stats.received_episodes == 24 and stats.rejected == {} and conserved(stats)


def test_batched_acks_lose_nothing_when_the_buffer_is_replaced(make_buffer, clients) -> None:
    """Every episode a producer sent is either acknowledged by the buffer that stored it or, once that buffer
    is gone, counted lost -- never both, never neither, with many episodes in flight."""
    old = make_buffer(agent_models={"solver": "m1"}, capacity_samples=4)
    producer = clients.producer(old, window=8, timeout_s=30.0)
    for index in range(8):  # groups of 2: only the first 4 opening episodes' acks flow, the rest park
        producer.send_episode(f"g{index}", 2, f"g{index}/e0", episode(f"g{index}", 0, ("solver",))[1])
    settle_acks(producer, old, 8)
    acked = 8 - producer.unacked
    assert 0 < acked < 8 and old.stats().parked_acks == producer.unacked
    endpoints = {"producer_endpoint": old.producer_endpoint, "consumer_endpoint": old.consumer_endpoint}
    old.stop()
    new = make_buffer(agent_models={"solver": "m1"}, **endpoints)
    assert producer.probe(timeout_s=60.0)  # the DEALER reconnects by itself: returns as soon as it has
    assert producer.lost_episodes == 8 - acked and producer.unacked == 0
    producer.send_episode("fresh", 1, "fresh/e0", episode("fresh", 0, ("solver",))[1])
    producer.flush()
    assert new.stats().received_episodes == 1 and producer.pop_rejections() == []


def test_a_learner_gets_a_large_sample_in_a_frame_of_its_own_and_small_ones_joined(make_buffer, clients) -> None:
    """What the buffer forwards is the producer's bytes unchanged: the large sample as the frame it arrived in
    (sent on by reference), the small samples of the pull joined in one frame."""
    buf = make_buffer(agent_models={"solver": "m1"})
    producer = clients.producer(buf)
    big, small = _sample("g", "g/e0", 20_000, 10, 0), _sample("g", "g/e0", 3, 1, 1)
    producer.send_episode("g", 1, "g/e0", [big, small, small])
    producer.flush()
    learner = zmq.Context.instance().socket(zmq.DEALER)
    learner.setsockopt(zmq.LINGER, 0)
    try:
        learner.connect(buf.consumer_endpoint)
        learner.send(encode_message(Pull(seq=1, agents=["solver"], wait_ms=1000)))
        assert learner.poll(60_000)
        frames = learner.recv_multipart()
    finally:
        learner.close()
    assert frames[1:] == [encode_sample(big), encode_sample(small) * 2]
    (group,) = decode_client_reply(frames).groups
    assert group.checked and open_group(group).samples == [big, small, small]
