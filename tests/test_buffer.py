"""The trajectory buffer over real sockets on 127.0.0.1 (free ports), plus its codecs and config."""

from __future__ import annotations

import os
import threading
import time

import msgspec
import pytest
import zmq
from buffer_harness import (  # noqa: F401  (fixtures)
    AGENTS,
    LOCAL,
    clients,
    conserved,
    episode,
    make_buffer,
    make_sample,
    send_group,
    settle_acks,
    wait_until,
)

from drmas.buffer import (
    BufferConfig,
    BufferConsumer,
    InsecureEndpointError,
    TrajectoryBuffer,
)
from drmas.buffer.framing import decode_message, encode_frames
from drmas.buffer.messages import (
    MESSAGE_SCHEMA_VERSION,
    Ack,
    EpisodeMsg,
    GroupBatch,
    Pull,
    encode_message,
)
from drmas.runtime.netsec import CurveClientKeys, CurveKeys, generate_keypair, is_local_endpoint

# ---- grouping and delivery ------------------------------------------------------------------------


def test_groups_are_delivered_whole_and_only_when_complete(make_buffer, clients) -> None:
    buf = make_buffer()
    producer, consumer = clients.producer(buf), clients.consumer(buf)
    for i in range(2):
        producer.send_episode("g0", 3, *episode("g0", i))
    producer.flush()
    assert consumer.pull(["solver", "verifier"], max_groups=10) == []
    assert consumer.stats().incomplete_groups == 1

    producer.send_episode("g0", 3, *episode("g0", 2))
    producer.flush()
    groups = consumer.pull(["solver"], max_groups=10, wait_ms=1000)
    assert len(groups) == 1
    (group,) = groups
    assert group.group_id == "g0" and group.agent == "solver" and group.model == "m1"
    assert [s.episode_id for s in group.samples] == ["g0/e0", "g0/e1", "g0/e2"]
    assert all(s.agent == "solver" for s in group.samples)
    assert group.samples[0].response_ids.tolist() == [4, 5]


def test_each_agent_gets_its_samples_with_every_episode_score(make_buffer, clients) -> None:
    buf = make_buffer()
    producer = clients.producer(buf)
    solver_learner, verifier_learner = clients.consumer(buf), clients.consumer(buf)
    for i in range(2):  # solver reward 1, verifier reward 0 -> trajectory score 0.5 in episode 0
        episode_id = f"g/e{i}"
        samples = [make_sample("g", episode_id, "solver", reward=1.0 + i), make_sample("g", episode_id, "verifier")]
        producer.send_episode("g", 2, episode_id, samples)
    producer.flush()

    (solver_group,) = solver_learner.pull(["solver"], max_groups=5, wait_ms=1000)
    (verifier_group,) = verifier_learner.pull(["verifier"], max_groups=5, wait_ms=1000)
    assert {s.agent for s in solver_group.samples} == {"solver"}
    assert {s.agent for s in verifier_group.samples} == {"verifier"}
    assert solver_group.episode_scores == verifier_group.episode_scores == {"g/e0": 0.5, "g/e1": 1.0}
    # each part names every agent of its group: a learner's agent with none had nothing to train in it
    assert solver_group.group_agents == verifier_group.group_agents == ["solver", "verifier"]
    assert solver_learner.pull(["solver"]) == [] and verifier_learner.pull(["verifier"]) == []


def test_pull_is_fair_across_agents_and_oldest_first(make_buffer, clients) -> None:
    buf = make_buffer()
    producer, consumer = clients.producer(buf), clients.consumer(buf)
    for g in ("g0", "g1", "g2"):
        send_group(producer, g, 1)
    producer.flush()
    first = consumer.pull(["solver", "verifier"], max_groups=2)
    assert [(g.group_id, g.agent) for g in first] == [("g0", "solver"), ("g0", "verifier")]
    rest = consumer.pull(["verifier", "solver"], max_groups=10)
    assert [g.group_id for g in rest] == ["g1", "g1", "g2", "g2"]


def test_parked_pull_is_answered_when_data_arrives_or_times_out(make_buffer, clients) -> None:
    buf = make_buffer()
    producer, consumer = clients.producer(buf), clients.consumer(buf)
    start = time.monotonic()
    assert consumer.pull(["solver"], wait_ms=200) == []
    assert time.monotonic() - start >= 0.18

    result: list = []
    waiter = threading.Thread(target=lambda: result.extend(consumer.pull(["solver"], wait_ms=120_000)))
    waiter.start()
    wait_until(lambda: buf.stats().parked_pulls == 1)  # parked before the data comes, however slow the machine
    start = time.monotonic()
    send_group(producer, "late", 2)
    producer.flush()
    waiter.join(120)
    assert [g.group_id for g in result] == ["late"]
    assert time.monotonic() - start < 60  # answered on arrival, not at the 120 s deadline


def test_many_producers_deliver_every_group_once(make_buffer, clients) -> None:
    buf = make_buffer()
    n_producers, n_groups, size = 4, 10, 2
    producers = [clients.producer(buf, f"p{i}", window=3) for i in range(n_producers)]

    def produce(index: int) -> None:
        for g in range(n_groups):
            send_group(producers[index], f"p{index}-g{g}", size)
        producers[index].flush()

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(n_producers)]
    for t in threads:
        t.start()
    consumer = clients.consumer(buf)
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + 10
    while len(seen) < n_producers * n_groups * 2 and time.monotonic() < deadline:
        seen += [(g.group_id, g.agent) for g in consumer.pull(["solver", "verifier"], max_groups=16, wait_ms=200)]
    for t in threads:
        t.join(5)
    assert len(seen) == len(set(seen)) == n_producers * n_groups * 2
    stats = consumer.stats()
    assert stats.received_episodes == n_producers * n_groups * size
    assert stats.delivered_samples == stats.received_samples and conserved(stats)


# ---- flow control and discards --------------------------------------------------------------------


def test_backpressure_slows_producers_and_loses_nothing(make_buffer, clients) -> None:
    buf = make_buffer(capacity_samples=8)
    producer = clients.producer(buf, window=2, timeout_s=10.0)
    n_groups, size = 30, 2
    done = threading.Event()

    def produce() -> None:
        for g in range(n_groups):
            send_group(producer, f"g{g}", size, agents=("solver",))
        producer.flush()
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    consumer = clients.consumer(buf)
    try:
        wait_until(lambda: consumer.stats().parked_acks > 0)
        time.sleep(0.3)
        stats = consumer.stats()
        assert not done.is_set(), "the producer should be waiting for credit"
        assert stats.received_episodes < n_groups * size
        assert stats.samples_in_buffer <= 8 + 2 * producer.window  # capacity + in-flight credit
        delivered = []
        deadline = time.monotonic() + 10
        while len(delivered) < n_groups and time.monotonic() < deadline:
            delivered += consumer.pull(["solver"], max_groups=4, wait_ms=500)
    finally:
        thread.join(10)
    assert done.is_set()
    assert sorted(g.group_id for g in delivered) == sorted(f"g{g}" for g in range(n_groups))
    assert all(len(g.samples) == size for g in delivered)
    stats = consumer.stats()
    assert stats.dropped == {} and stats.rejected == {} and conserved(stats)
    assert stats.delivered_samples == n_groups * size


def test_incomplete_group_is_discarded_after_timeout(make_buffer, clients) -> None:
    buf = make_buffer(incomplete_timeout_s=0.3)
    producer, consumer = clients.producer(buf), clients.consumer(buf)
    producer.send_episode("orphan", 2, *episode("orphan", 0))
    producer.flush()
    wait_until(lambda: consumer.stats().dropped.get("incomplete_group") == 2)
    stats = consumer.stats()
    assert stats.incomplete_groups == 0 and stats.dropped_groups == {"incomplete_group": 1} and conserved(stats)

    producer.send_episode("orphan", 2, *episode("orphan", 1))  # its sibling arrives too late
    producer.flush()
    assert [r.reason for r in producer.pop_rejections()] == ["group_discarded"]
    assert consumer.pull(["solver", "verifier"]) == []


def test_a_group_its_producer_abandons_is_dropped_and_its_admission_returned_at_once(make_buffer, clients) -> None:
    """An episode of an external program that never reported its reward: the rollout abandons its group, so the
    buffer drops what arrived of it, refuses the rest and frees the group's admission slot without waiting for
    the incomplete timeout (600 s here); its draw is drawn again."""
    buf = make_buffer(agent_models={"solver": "m1"}, groups_per_step={"m1": 3}, max_staleness=0)
    producer = clients.producer(buf)
    clients.consumer(buf).report_version("m1", 0)
    assert producer.request_admission(3) == [0, 1, 2]
    send_group(producer, "done", 1, agents=("solver",), draw=0)
    producer.send_episode("torn", 2, *episode("torn", 0, agents=("solver",)), draw=1)  # one of its 2 arrived ...
    producer.flush()
    assert producer.request_admission(1) == []  # 'done' accepted, 'torn' and the third group running
    producer.abandon_group("torn", 1)  # ... the other one never will
    producer.abandon_group("unstarted", 2)  # the third admitted group: none of its episodes was sent
    stats = producer.stats()  # answered after both (one socket, in order)
    assert stats.dropped == {"abandoned_group": 1} and stats.dropped_groups == {"abandoned_group": 1}
    assert stats.incomplete_groups == 0 and stats.running_groups == 0 and conserved(stats)
    producer.send_episode("torn", 2, *episode("torn", 1, agents=("solver",)), draw=1)  # a late sibling is refused
    producer.flush()
    assert [r.reason for r in producer.pop_rejections()] == ["group_discarded"]
    assert producer.request_admission(5) == [1, 2]  # both slots came back ('done' counts), their draws again
    assert producer.stats().draws["redrawn"] == 2


def test_discard_api_and_learner_drop_reports_are_counted(make_buffer, clients) -> None:
    buf = make_buffer()
    producer, consumer = clients.producer(buf), clients.consumer(buf)
    for g in ("keep", "bad"):
        send_group(producer, g, 2)
    producer.flush()
    wait_until(lambda: buf.stats().depth.get("solver") == 2)
    assert buf.discard("solver", lambda group: group.group_id == "bad", "bad_prompt") == 1
    assert [g.group_id for g in consumer.pull(["solver"], max_groups=5)] == ["keep"]
    consumer.report_drops("verifier", ["bad"], n_samples=2, reason="learner_stale")
    stats = consumer.stats()
    assert stats.dropped == {"bad_prompt": 2} and stats.reported_drops == {"learner_stale": 2}
    assert conserved(stats)


# ---- bad input -------------------------------------------------------------------------------------


def _raw_reply(sock: zmq.Socket) -> Ack:
    assert sock.poll(3000), "no answer from the buffer"
    reply = decode_message(sock.recv())
    assert isinstance(reply, Ack)
    return reply


def test_bad_messages_are_refused_counted_and_the_buffer_keeps_serving(make_buffer, clients) -> None:
    buf = make_buffer(max_message_bytes=4096)
    raw = clients.raw(buf.producer_endpoint)
    bad_lengths = make_sample("g", "g/e0", "solver")
    bad_lengths.behaviour_logprobs = [-1.0]  # two response tokens, one log-prob
    cases = {
        "malformed": [os.urandom(64), msgspec.msgpack.encode({"type": "Nope", "schema_version": MESSAGE_SCHEMA_VERSION})],
        "schema_version": [msgspec.msgpack.encode({"type": "EpisodeMsg", "schema_version": 99, "future": 1})],
        "oversized": [b"\x00" * 5000],
        "unexpected_message": [encode_message(Pull(seq=7, agents=["solver"]))],
        "unknown_agent": [encode_frames(EpisodeMsg(producer="x", seq=8, group_id="g", group_size=1,
                                                   episode_id="g/e0", samples=[make_sample("g", "g/e0", "critic")]))],
        "invalid": [encode_frames(EpisodeMsg(producer="x", seq=9, group_id="g", group_size=1, episode_id="g/e0",
                                             samples=[bad_lengths]))],
    }
    for reason, payloads in cases.items():
        for payload in payloads:
            raw.send_multipart(payload if isinstance(payload, list) else [payload])
            reply = _raw_reply(raw)
            assert (reply.accepted, reply.reason) == (False, reason), reply
    one_sample = encode_frames(EpisodeMsg(producer="x", seq=10, group_id="f", group_size=1, episode_id="f/e0",
                                          samples=[make_sample("f", "f/e0", "solver")]))
    for frames in (one_sample[:1], one_sample + one_sample[1:], [encode_message(Pull(seq=10, agents=["solver"])), b"x"]):
        raw.send_multipart(frames)  # a sample frame missing, one too many, a sample frame after a pull
        reply = _raw_reply(raw)
        assert (reply.seq, reply.reason) == (10, "bad_framing"), reply
    raw.send(encode_message(Pull(seq=11, agents=["solver"])))
    assert _raw_reply(raw).seq == 11

    producer, consumer = clients.producer(buf), clients.consumer(buf)
    episode_id, samples = episode("huge", 0)
    samples[0].response_ids = list(range(600))  # over the 4 KiB limit, under libzmq's hard 4x cut-off
    samples[0].behaviour_logprobs = [-1.0] * 600
    producer.send_episode("huge", 1, episode_id, samples)
    producer.flush()  # the refusal is matched to the episode, so nothing stays unacknowledged
    assert [(r.episode_id, r.reason) for r in producer.pop_rejections()] == [("huge/e0", "oversized")]
    send_group(producer, "fine", 1)
    producer.flush()
    assert producer.pop_rejections() == []
    assert [g.group_id for g in consumer.pull(["solver"], wait_ms=1000)] == ["fine"]
    rejected = consumer.stats().rejected
    assert rejected == {"malformed": 2, "schema_version": 1, "oversized": 2, "unexpected_message": 2,
                        "unknown_agent": 1, "invalid": 1, "bad_framing": 3}


def test_header_only_validation_isolates_a_bad_sample_at_the_learner(make_buffer, clients) -> None:
    buf = make_buffer(validate_samples=False)
    producer, consumer = clients.producer(buf), clients.consumer(buf)
    send_group(producer, "good", 1, agents=("solver",))
    episode_id, (bad,) = episode("bad", 0, agents=("solver",))
    bad.behaviour_logprobs = [-1.0]  # passes the routing-header check, fails the full decode
    producer.send_episode("bad", 1, episode_id, [bad])
    producer.flush()
    wait_until(lambda: buf.stats().depth.get("solver") == 2)
    assert [g.group_id for g in consumer.pull(["solver"], max_groups=5)] == ["good"]
    assert consumer.stats().reported_drops == {"invalid": 1}


def test_messages_round_trip_and_carry_the_schema_version() -> None:
    samples = episode("g", 0)[1]
    message = EpisodeMsg(producer="p", seq=1, group_id="g", group_size=2, episode_id="g/e0", samples=samples)
    frames = encode_frames(message)
    assert msgspec.msgpack.decode(frames[0])["schema_version"] == MESSAGE_SCHEMA_VERSION
    assert decode_message(frames) == message
    batch = GroupBatch(seq=2, groups=[])
    assert decode_message(encode_frames(batch)) == batch


# ---- admission and staleness -----------------------------------------------------------------------


def test_synchronous_admission_waits_for_the_learner_version(make_buffer, clients) -> None:
    buf = make_buffer(agent_models={"solver": "m1"}, groups_per_step={"m1": 2}, max_staleness=0)
    producer, learner = clients.producer(buf), clients.consumer(buf)
    assert producer.request_admission(5) == []  # no learner heard from yet: its version is unknown
    learner.report_version("m1", 0)
    assert producer.request_admission(5) == [0, 1]  # (0 + 0 + 1) * 2 groups: the first two draws
    assert producer.request_admission(1) == []  # both running
    for draw, g in enumerate(("a", "b")):
        send_group(producer, g, 2, agents=("solver",), draw=draw)
    producer.flush()
    assert producer.request_admission(1) == []  # both accepted, version still 0
    stats = learner.stats()
    assert stats.running_groups == 0 and stats.accepted_groups == {"m1": 2}

    assert len(learner.pull(["solver"], max_groups=2)) == 2
    learner.report_version("m1", 1)
    assert producer.request_admission(5) == [2, 3]  # (0 + 1 + 1) * 2 - 2


def test_stale_groups_are_dropped_at_delivery_and_their_budget_returned(make_buffer, clients) -> None:
    buf = make_buffer(agent_models={"solver": "m1"}, groups_per_step={"m1": 1}, max_staleness=0)
    producer, learner = clients.producer(buf), clients.consumer(buf)
    send_group(producer, "old", 1, agents=("solver",), version=0)
    producer.flush()
    learner.report_version("m1", 1)
    send_group(producer, "new", 1, agents=("solver",), version=1)
    producer.flush()
    assert [g.group_id for g in learner.pull(["solver"], max_groups=5)] == ["new"]
    stats = learner.stats()
    assert stats.dropped == {"stale": 1} and conserved(stats)
    assert stats.accepted_groups == {"m1": 1}  # 'old' was given back, 'new' counts


def test_unclaimed_leases_expire(make_buffer, clients) -> None:
    """On the buffer's own clock, moved by the test: a slow machine can neither expire the leases early nor
    make the wait for their expiry run out."""
    now = [0.0]
    buf = make_buffer(agent_models={"solver": "m1"}, groups_per_step={"m1": 3}, max_staleness=0,
                      lease_timeout_s=10.0, clock=lambda: now[0])
    producer = clients.producer(buf)
    clients.consumer(buf).report_version("m1", 0)
    assert producer.request_admission(3) == [0, 1, 2]
    assert producer.stats().expired_lease_groups == 0 and producer.stats().running_groups == 3
    now[0] = 10.5
    wait_until(lambda: producer.stats().expired_lease_groups == 3, timeout_s=60)
    assert producer.stats().running_groups == 0
    assert producer.request_admission(3) == [0, 1, 2]  # never started: the same draws again
    assert producer.stats().draws["redrawn"] == 3


# ---- security ----------------------------------------------------------------------------------------


def test_curve_keeps_unknown_clients_out(make_buffer, clients) -> None:
    server_public, server_secret = generate_keypair()
    client_public, client_secret = generate_keypair()
    stranger_public, stranger_secret = generate_keypair()
    buf = make_buffer(curve=CurveKeys(server_public, server_secret, frozenset({client_public})))
    trusted = CurveClientKeys(client_public, client_secret, server_public)
    untrusted = CurveClientKeys(stranger_public, stranger_secret, server_public)

    producer = clients.producer(buf, curve=trusted)
    send_group(producer, "g", 1)
    producer.flush()

    for keys in (None, untrusted):
        intruder = clients.producer(buf, "intruder", curve=keys, timeout_s=0.4)
        # the send itself may time out (the failed handshake dropped the only pipe) or the flush may
        with pytest.raises(TimeoutError, match="127.0.0.1"):
            intruder.send_episode("x", 1, *episode("x", 0))
            intruder.flush()
        thief = clients.consumer(buf, curve=keys, timeout_s=0.4)
        with pytest.raises(TimeoutError, match="127.0.0.1"):
            thief.pull(["solver", "verifier"], max_groups=10)

    learner = clients.consumer(buf, curve=trusted)
    assert len(learner.pull(["solver", "verifier"], max_groups=10)) == 2
    assert learner.stats().received_episodes == 1


def test_non_loopback_bind_requires_curve() -> None:
    with pytest.raises(InsecureEndpointError, match="CURVE"):
        TrajectoryBuffer(BufferConfig(producer_endpoint="tcp://0.0.0.0:0", consumer_endpoint=LOCAL))
    assert is_local_endpoint("tcp://127.0.0.1:5") and is_local_endpoint("tcp://[::1]:5")
    assert is_local_endpoint("ipc:///tmp/x") and is_local_endpoint("tcp://localhost:5")
    assert not is_local_endpoint("tcp://*:5") and not is_local_endpoint("tcp://10.0.0.2:5")


def test_config_is_validated_with_field_names() -> None:
    with pytest.raises(ValueError, match="capacity_samples"):
        BufferConfig(capacity_samples=0).validate("buffer")
    with pytest.raises(ValueError, match="curve_authorized_keys_dir"):
        BufferConfig(curve_server_secret_file="x").validate("buffer")
    assert all(BufferConfig.help().values())


def test_client_times_out_naming_the_endpoint(clients) -> None:
    with zmq.Context.instance().socket(zmq.ROUTER) as silent:
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        consumer = BufferConsumer(f"tcp://127.0.0.1:{port}", timeout_s=0.2)
        clients._keep(consumer)
        with pytest.raises(TimeoutError, match=f"127.0.0.1:{port}"):
            consumer.stats()



def test_serve_forever_ends_on_stop_from_another_thread(clients) -> None:
    buf = TrajectoryBuffer(BufferConfig(producer_endpoint=LOCAL, consumer_endpoint=LOCAL))
    loop = threading.Thread(target=buf.serve_forever)
    loop.start()
    try:
        assert clients.consumer(buf).stats().received_episodes == 0
    finally:
        buf.stop()
        loop.join(5)
    assert not loop.is_alive()
    assert buf.stats().received_episodes == 0  # counters outlive the sockets


def test_clients_recover_when_the_buffer_process_is_replaced(make_buffer, clients) -> None:
    """A restarted buffer knows nothing of earlier episodes or versions. Its producers must stop waiting for
    acks the old one never sent (counting those episodes as lost), and its learners must re-send their
    versions, or admission and the stale rule would work from version 0."""
    old = make_buffer(agent_models={"solver": "m1"}, capacity_samples=2)
    producer = clients.producer(old, window=1, timeout_s=30.0)
    learner = clients.consumer(old, timeout_s=30.0)
    learner.report_version("m1", 3)
    sent = 0
    while producer.unacked == 0:  # fill the buffer until it withholds an ack (backpressure)
        producer.send_episode(f"g{sent}", 4, f"g{sent}/e0", episode(f"g{sent}", 0, ("solver",), version=3)[1])
        sent += 1
        settle_acks(producer, old, sent)
        assert sent < 10, "the buffer never withheld an ack"
    endpoints = {"producer_endpoint": old.producer_endpoint, "consumer_endpoint": old.consumer_endpoint}
    old.stop()
    new = make_buffer(agent_models={"solver": "m1"}, capacity_samples=2, **endpoints)

    assert producer.probe(timeout_s=60.0)  # the DEALER reconnects by itself; the reply names the new buffer
    assert producer.buffer_restarts == 1 and producer.unacked == 0 and producer.lost_episodes == 1
    assert learner.pull(["solver"], max_groups=1, wait_ms=0) == []
    assert learner.buffer_restarts == 1
    assert new.stats().model_versions == {"m1": 3}  # re-sent right after the pull noticed the restart
    send_group(producer, "fresh", 1, agents=("solver",), version=3)  # and the stream goes on
    producer.flush()
    assert [g.group_id for g in learner.pull(["solver"], max_groups=1, wait_ms=1000)] == ["fresh"]


def test_a_dead_producer_releases_its_budget_and_unfinished_groups(make_buffer, clients) -> None:
    """A rollout that dies mid-group must not hold the staleness budget for long: once its heartbeats stop,
    its unfinished groups are dropped (counted) and its admitted groups return to the budget.

    On the buffer's own clock, moved by the test: each move is shorter than producer_timeout_s and the next one
    waits for both producers' heartbeats at the current time, so a slow machine can neither starve a heartbeat
    past the timeout nor make the wait for the release run out."""
    now = [0.0]
    buf = make_buffer(agent_models={"solver": "m1"}, groups_per_step={"m1": 2}, max_staleness=0,
                      producer_timeout_s=1.0, clock=lambda: now[0])
    dying = clients.producer(buf, name="dying", heartbeat_s=0.1)
    other = clients.producer(buf, name="other", heartbeat_s=0.1)
    clients.consumer(buf).report_version("m1", 0)
    assert dying.request_admission(2) == [0, 1]  # the whole budget of version 0
    producer_id, samples = episode("half", 0, ("solver",))
    dying.send_episode("half", 2, producer_id, samples, draw=0)  # one of two episodes, then it dies
    dying.flush()
    assert other.request_admission(1) == []
    for step in range(1, 4):  # 1.5 s on the buffer's clock, longer than producer_timeout_s
        now[0] = 0.5 * step
        wait_until(lambda: _heard_at(buf, "dying") == _heard_at(buf, "other") == now[0], timeout_s=60)
    assert buf.stats().running_groups == 2 and buf.stats().dropped == {}  # heartbeats kept both alive
    dying.close()
    for step in range(4, 8):  # on to 3.5 s: the closed one's silence passes the timeout, the other's does not
        now[0] = 0.5 * step
        wait_until(lambda: _heard_at(buf, "other") == now[0], timeout_s=60)
    wait_until(lambda: buf.stats().dropped.get("producer_gone") == 1, timeout_s=60)
    stats = buf.stats()
    assert stats.running_groups == 0 and stats.incomplete_groups == 0 and conserved(stats)
    assert other.request_admission(2) == [0, 1]  # the budget is free again, and its draws are drawn again


def _heard_at(buf: TrajectoryBuffer, producer: str) -> float | None:
    """When (on the buffer's clock) the buffer last heard from `producer`: its own bookkeeping, read under its lock."""
    with buf._lock:
        return buf._producer_seen.get(producer)
