"""The relay chain of the weight channel (``drmas/weights/relay.py``) with real rollout processes: a push
reaches several rollouts while the learner sends each byte once, and a rollout killed in the middle of the
chain mid-push does not stall the others."""

from __future__ import annotations

import time

import pytest
import zmq
from weight_harness import CFG, cluster, digests, learner, make_weights

from drmas.config.weights import WeightSyncConfig
from drmas.weights import NamedTensors, WeightSender, messages
from drmas.weights.learner.peers import Peer
from drmas.weights.relay import HopNames, plan_wave

pytestmark = pytest.mark.timeout(90)


def _written_bytes() -> int:
    """Bytes this process has passed to write-family syscalls, sockets included (the learner's traffic)."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


class CountedPasses(NamedTensors):
    """Named tensors that count the passes read from them (a sharded learner gathers once per pass)."""

    def __init__(self, named) -> None:
        super().__init__(named)
        self.passes = 0

    def open(self):
        self.passes += 1
        return super().open()


@pytest.mark.e2e
def test_push_to_three_rollouts_relays_identical_weights_and_survives_a_killed_one() -> None:
    w1, w2 = make_weights(1, layers=40), make_weights(2, layers=40)  # ~10 MB each, 40 units of 256 KiB
    with cluster() as c, learner(make_weights(0), 0, chunk_mb=0.25) as s:
        c.receiver(s.endpoint, "a")
        c.receiver(s.endpoint, "b", slow_s=0.05)  # ~2.5 s to take 10 MB: the kill below lands mid-transfer
        c.receiver(s.endpoint, "c", poll_mode=True)
        c.wait_for({"a": 0, "b": 0, "c": 0}, timeout=40)
        s.wait_acked({"a": 0, "b": 0, "c": 0})

        written = _written_bytes()
        report = s.push(w1, 1)
        written = _written_bytes() - written
        assert report.receivers_ok == ["a", "b", "c"], report
        assert report.learner_sends == 1 and report.resent == []  # one chain a -> b -> c
        # Measured, not counted: what the learner process wrote is one copy (pairs would write three).
        assert report.bytes <= written < 1.3 * report.bytes, (written, report.bytes)
        for seen in c.wait_for({"a": 1, "b": 1, "c": 1}).values():
            assert seen == digests(w1)

        killer = c.kill_once_started("b")  # the middle of the chain dies mid-push
        try:
            start = time.monotonic()
            source = CountedPasses(list(w2.items()))
            with s.sender.exclusive():
                s.weights, s.version = w2, 2
                report = s.sender.push(source, 2)
            elapsed = time.monotonic() - start
        finally:
            killer.join()
        assert report.receivers_ok == ["a", "c"] and report.receivers_dropped == ["b"], report
        assert report.resent == ["c"], report  # c lost its predecessor: served again within the same push
        assert source.passes == report.learner_sends == 2  # the resend read the source again (a new gather)
        assert elapsed < CFG["timeout_s"], elapsed  # b's sockets closed: no deadline was waited out
        for seen in c.wait_for({"a": 2, "c": 2}).values():
            assert seen == digests(w2)
        assert set(s.sender.receivers()) == {"a", "c"}


def test_chain_plans_reuse_a_hop_only_while_both_ends_still_hold_it() -> None:
    """A hop's rendezvous keys on the store serve one build: a link that left the chain (or a wave where
    something failed) must come back under a new name, or its rebuild would meet the old group's keys and
    hang the push (found by bench/fanout.py alternating chain and pairs)."""
    a, b, c = (Peer(rid, rid.encode(), f"pair-{rid}", last_seen=0.0) for rid in "abc")
    vllm = Peer("v", b"v", "pair-v", last_seen=0.0, ranks=2, relay=False)
    names = HopNames()
    plan = plan_wave([c, vllm, a, b], 1, "chain", names)
    routes = {peer.receiver_id: route for peer, route in plan.routes}
    assert [p.receiver_id for p in plan.targets] == ["v", "a"]  # engine workers over their pair; chain head
    assert routes["a"].upstream == "" and routes["a"].downstream == routes["b"].upstream != ""
    assert routes["b"].downstream == routes["c"].upstream != "" and routes["c"].downstream == ""
    assert plan.successor == {"a": b, "b": c} and "v" not in routes
    ab = routes["a"].downstream
    again = {p.receiver_id: r for p, r in plan_wave([a, b], 2, "chain", names).routes}
    assert again["a"].downstream == ab  # same link in consecutive waves: both ends kept it
    plan = plan_wave([a, b], 3, "pairs", names)
    assert all(r.upstream == r.downstream == "" for _, r in plan.routes) and len(plan.targets) == 2
    back = {p.receiver_id: r for p, r in plan_wave([a, b], 4, "chain", names).routes}
    assert back["a"].downstream not in ("", ab)  # the ends closed it meanwhile: a fresh name
    names.forget()
    assert {p.receiver_id: r for p, r in plan_wave([a, b], 5, "chain", names).routes}["a"].downstream not in (
        "", ab, back["a"].downstream)


def test_a_rollout_of_the_previous_weight_protocol_is_refused_with_a_message() -> None:
    """A protocol-2 rollout would wait on its pair for units that now come from its predecessor: refused."""
    with WeightSender("127.0.0.1", config=WeightSyncConfig(**CFG)) as sender:
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        try:
            dealer.connect(sender.endpoint)
            dealer.send(messages.encode(messages.Join("old-rollout", "", nonce=5, protocol=2)))
            assert dealer.poll(5000), "no answer to the Join"
            reply = messages.decode(dealer.recv())
        finally:
            dealer.close(linger=0)
            context.term()
    assert isinstance(reply, messages.Refuse) and reply.nonce == 5
    assert "'old-rollout' speaks weight protocol 2" in reply.reason and f"learner {messages.PROTOCOL_VERSION}" in reply.reason
    assert sender.receivers() == {}
