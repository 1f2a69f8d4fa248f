"""Helpers of the trajectory-buffer tests: samples and episodes, clients that are always closed, buffers on
free loopback ports that are always stopped."""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Callable, Iterator, Sequence

import pytest
import zmq

from drmas.buffer import BufferConfig, BufferConsumer, BufferProducer, TrajectoryBuffer
from drmas.buffer.framing import decode_message
from drmas.buffer.messages import Ack, Acks
from drmas.core.sample import Sample

AGENTS = {"solver": "m1", "verifier": "m2"}
LOCAL = "tcp://127.0.0.1:0"


def make_sample(group: str, episode: str, agent: str, reward: float = 0.0, version: int = 0, turn: int = 0) -> Sample:
    return Sample(
        episode_id=episode, group_id=group, agent=agent, model=AGENTS.get(agent, "m1"), turn=turn,
        prompt_ids=[1, 2, 3], response_ids=[4, 5], behaviour_logprobs=[-0.5, -0.25],
        policy_version=version, temperature=1.0, valid=True, reward=reward,
    )


def episode(group: str, index: int, agents: Sequence[str] = ("solver", "verifier"), reward: float = 0.0,
            version: int = 0) -> tuple[str, list[Sample]]:
    """One episode's id and samples: one call per agent, all with the same reward."""
    episode_id = f"{group}/e{index}"
    return episode_id, [make_sample(group, episode_id, a, reward, version, turn) for turn, a in enumerate(agents)]


def send_group(producer: BufferProducer, group: str, size: int, agents: Sequence[str] = ("solver", "verifier"),
               version: int = 0, draw: int = -1) -> None:
    for i in range(size):
        episode_id, samples = episode(group, i, agents, reward=float(i), version=version)
        producer.send_episode(group, size, episode_id, samples, draw=draw)


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `condition` until it holds; the deadline only bounds a test that would otherwise hang (a wait that
    succeeds returns at once), so it is generous: a slow machine must not fail a correct test."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def settle_acks(producer: BufferProducer, buf: TrajectoryBuffer, sent: int) -> None:
    """Until `buf` holds the `sent` episodes (all the producer sent) and the producer has read every ack the
    buffer sent: what it still waits for then is what the buffer withholds (`parked_acks`). A flush with a
    short deadline could not tell those from acks a slow machine has not delivered yet."""

    def settled() -> bool:
        try:
            producer.flush(timeout_s=0.05)  # reads the acks that have arrived
        except TimeoutError:
            pass
        stats = buf.stats()
        return stats.received_episodes == sent and producer.unacked == stats.parked_acks

    wait_until(settled, timeout_s=60)


def conserved(stats) -> bool:
    """Every accepted sample is delivered, dropped with a reason, or still held."""
    return stats.received_samples == stats.delivered_samples + sum(stats.dropped.values()) + stats.samples_in_buffer


def replies(sock: zmq.Socket, n: int, timeout_ms: int = 60_000) -> list:
    """Up to `n` answers on a raw socket, one per request: an `Acks` (every episode the buffer stored in one
    round) counts as an accepting `Ack` for each of its seqs. `timeout_ms` bounds the wait for each next answer
    (answers that come return at once): only a test expecting fewer than `n` should shorten it."""
    out: list = []
    while len(out) < n and sock.poll(timeout_ms):
        reply = decode_message(sock.recv_multipart())
        out += [Ack(seq=seq, accepted=True) for seq in reply.seqs] if isinstance(reply, Acks) else [reply]
    return out


class Clients:
    """Creates clients for one test and always closes them."""

    def __init__(self) -> None:
        self._made: list = []

    def producer(self, buf: TrajectoryBuffer, name: str = "p0", **kw) -> BufferProducer:
        kw.setdefault("timeout_s", 5.0)
        return self._keep(BufferProducer(buf.producer_endpoint, name, **kw))

    def consumer(self, buf: TrajectoryBuffer, **kw) -> BufferConsumer:
        kw.setdefault("timeout_s", 5.0)
        return self._keep(BufferConsumer(buf.consumer_endpoint, **kw))

    def raw(self, endpoint: str) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        return self._keep(sock)

    def _keep(self, obj):
        self._made.append(obj)
        return obj

    def close(self) -> None:
        for obj in self._made:
            obj.close()


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def make_buffer() -> Iterator[Callable[..., TrajectoryBuffer]]:
    """Start buffers on free loopback ports; config fields and constructor kwargs may be mixed."""
    started: list[TrajectoryBuffer] = []
    config_names = {f.name for f in fields(BufferConfig)}

    def make(**kw) -> TrajectoryBuffer:
        config = {k: kw.pop(k) for k in list(kw) if k in config_names}
        config.setdefault("producer_endpoint", LOCAL)
        config.setdefault("consumer_endpoint", LOCAL)
        kw.setdefault("agent_models", AGENTS)
        buf = TrajectoryBuffer(BufferConfig(**config), **kw)
        started.append(buf)
        return buf.start()

    try:
        yield make
    finally:
        for buf in started:
            buf.stop()
