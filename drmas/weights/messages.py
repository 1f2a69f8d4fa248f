"""Control messages of the weight channel (ZeroMQ, msgpack via msgspec).

The tensor bytes never travel here: they go through the pair's process group. These messages only set up
pairs, announce what is about to be broadcast, and report back. Every message after the Welcome names its
``pair_id`` so that a message meant for an earlier pair (a learner or rollout that restarted, a queued
message delivered late) is recognised and ignored instead of desynchronising a pair.

Sequence for one receiver::

    rollout                              learner
    Join(receiver_id, model, nonce)  ->
                                     <-  Welcome(nonce, pair_id, store address, backend, timeouts)
    (the learner and the rollout's receiving ranks build the pair group on the learner's TCPStore)
    Ping(pair_id)                    ->  (every heartbeat_s)
                                     <-  Pong(pair_id)
                                     <-  Manifest(pair_id, version, layout)   (join sync or push)
    Ready(pair_id, version)          ->  (the rollout paused generation and is about to receive)
                                     <-  Route(pair_id, version, upstream, downstream)   (relay chain, see relay.py)
    (unit broadcasts over the pair group, or from the predecessor's hop group, passed on to the successor's)
    Applied(pair_id, version, ok, error, forward_error, upstream_failed) ->
                                     <-  Rejoin(pair_id, reason)   (learner dropped the pair or does not know it)
    Leave(pair_id)                   ->  (rollout shuts down)
"""

from __future__ import annotations

from typing import Union

import msgspec

from drmas.weights.chunks import Layout

# 2: Join.ranks (a rollout may bring several receiving ranks); a learner of protocol 1 would build a
# two-rank group for them and hang, so the versions refuse each other.
# 3: the relay chain (Route, Join.relay, Applied.forward_error/upstream_failed): a rollout of protocol 2 would
# wait for units on its pair that now come from its predecessor, so 2 and 3 refuse each other.
PROTOCOL_VERSION = 3
MAX_RANKS = 1024  # receiving ranks one rollout may bring (vLLM workers: tensor x pipeline parallel size)


class Join(msgspec.Struct, tag="join", frozen=True):
    """A rollout asks to receive the weights of ``model`` ('' matches any learner).

    ``ranks`` is how many members the rollout brings to the pair group: 1 when the rollout process receives
    itself, N when an engine's N workers receive directly (ranks 1..N of the group).
    """

    receiver_id: str
    model: str
    nonce: int  # distinguishes this attempt's Welcome from answers to earlier attempts
    protocol: int = PROTOCOL_VERSION
    ranks: int = 1
    relay: bool = True  # can take a place in a relay chain (receives in this process); False: pair only


class Welcome(msgspec.Struct, tag="welcome", frozen=True):
    """The learner accepted a Join: build the pair group under ``pair_id`` on its store."""

    nonce: int
    pair_id: str
    store_host: str  # '' = the host of the control endpoint
    store_port: int
    backend: str  # 'gloo' or 'nccl'
    timeout_s: float
    heartbeat_s: float
    peer_timeout_s: float


class Refuse(msgspec.Struct, tag="refuse", frozen=True):
    """The learner will not serve this Join (wrong model or protocol)."""

    nonce: int
    reason: str


class Manifest(msgspec.Struct, tag="manifest", frozen=True):
    """The next broadcasts on the pair carry ``version`` laid out as ``layout``.

    ``incarnation`` names the learner process that made these weights: a learner resumed from a checkpoint
    numbers its versions again from there, so a version number alone does not name one set of weights.
    """

    pair_id: str
    version: int
    layout: Layout
    incarnation: str = ""


class Ready(msgspec.Struct, tag="ready", frozen=True):
    """The rollout paused generation and is receiving ``version``: the learner may broadcast now."""

    pair_id: str
    version: int


class Route(msgspec.Struct, tag="route", frozen=True):
    """Where this rollout takes ``version``'s units from and passes them on to (see ``relay.py``).

    ``upstream`` '' = from the learner over the pair; else the id of the two-rank hop group shared with the
    predecessor (this rollout is its rank 1). ``downstream`` '' = pass nothing on; else the hop group to the
    successor (this rollout is its rank 0). Hop groups live on the learner's store, like pairs.
    """

    pair_id: str
    version: int
    upstream: str = ""
    downstream: str = ""


class Applied(msgspec.Struct, tag="ack", frozen=True):
    """``version`` was received; ``ok`` tells whether the apply callback accepted it.

    ``upstream_failed``: the predecessor in the relay chain failed mid-transfer, so nothing was applied; the
    pair is fine and the learner sends the version again. ``forward_error``: this rollout got the version but
    could not pass it on to its successor (which the learner then drops from the push).
    """

    pair_id: str
    version: int
    ok: bool
    error: str = ""
    forward_error: str = ""
    upstream_failed: bool = False


class Ping(msgspec.Struct, tag="heartbeat", frozen=True):
    pair_id: str


class Pong(msgspec.Struct, tag="heartbeat_reply", frozen=True):
    pair_id: str


class Rejoin(msgspec.Struct, tag="rejoin", frozen=True):
    """The learner has no (more) pair ``pair_id``: tear it down and Join again."""

    pair_id: str
    reason: str


class Leave(msgspec.Struct, tag="leave", frozen=True):
    """The rollout is shutting down; the learner forgets the pair without waiting for a timeout."""

    pair_id: str


Message = Union[Join, Welcome, Refuse, Manifest, Ready, Route, Applied, Ping, Pong, Rejoin, Leave]

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def decode(data: bytes) -> Message:
    """Decode and validate; raises `msgspec.DecodeError` (a ValueError) on malformed or foreign data."""
    return _DECODER.decode(data)
