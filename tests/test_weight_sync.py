"""The weight channel: chunk layout round trips (in process), then real learner/rollout processes.

Process tests use the real learner and rollout processes of ``weight_harness``.
"""

from __future__ import annotations

import time

import msgspec
import pytest
import torch
from weight_harness import CFG, STARTED, cluster, digest, digests, learner, make_weights

from drmas.config.weights import WeightSyncConfig
from drmas.weights import WeightReceiver, WeightSender, messages, pack, plan_layout, unpack
from drmas.weights.chunks import ALIGN, BufferPool, Unpacker
from drmas.weights.transport import resolve_backend

pytestmark = pytest.mark.timeout(90)



# ====================================================================================== chunks (in process)


def _roundtrip(named: dict[str, torch.Tensor], chunk_bytes: int) -> dict[str, torch.Tensor]:
    layout, units = pack(named.items(), chunk_bytes)
    assert all(u.numel() <= chunk_bytes for u in units)
    return dict(unpack(layout, units))


@pytest.mark.parametrize("chunk_bytes", [ALIGN, 1000, 4096, 1 << 20])
def test_chunks_round_trip_across_dtypes_and_chunk_sizes(chunk_bytes: int) -> None:
    named = make_weights(0, big_mb=0.01)
    named["transposed"] = torch.randn(7, 5).t()  # non-contiguous
    named["f64"] = torch.randn(3, dtype=torch.float64)
    named["u8"] = torch.arange(9, dtype=torch.uint8)
    out = _roundtrip(named, chunk_bytes)
    assert sorted(out) == sorted(named)  # every name, aliases included
    originals = [n for n in named if n != "lm_head.weight"]
    assert [n for n in out if n != "lm_head.weight"] == originals  # order kept; an alias follows its original
    for name, tensor in named.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape, name
        assert digest(out[name]) == digest(tensor), name


def test_chunks_empty_update_and_only_empty_tensors() -> None:
    layout, units = pack([], 1024)
    assert layout.units == [] and units == [] and list(unpack(layout, units)) == []
    named = {"a": torch.empty(0), "b": torch.empty(3, 0, dtype=torch.bfloat16)}
    layout, units = pack(named.items(), 1024)
    assert sum(u.nbytes for u in layout.units) == 0
    out = dict(unpack(layout, units))
    assert {k: (v.shape, v.dtype) for k, v in out.items()} == {k: (v.shape, v.dtype) for k, v in named.items()}


def test_chunks_tied_names_are_sent_once_and_large_tensors_are_sliced() -> None:
    big = torch.randn(1000)  # 4000 bytes
    named = [("w", big), ("small", torch.ones(3)), ("tied", big)]
    layout = plan_layout(named, chunk_bytes=1024)
    assert layout.payload_bytes == 4000 + 12
    assert [s.alias_of for s in layout.tensors] == [-1, -1, 0]
    sliced = [u for u in layout.units if u.sliced]
    assert len(sliced) == 4 and sum(u.nbytes for u in sliced) == 4000
    assert all(u.nbytes <= 1024 for u in layout.units)
    out = dict(unpack(*pack(named, 1024)))
    assert out["w"] is not None and torch.equal(out["tied"], big) and torch.equal(out["w"], big)


def test_chunks_reject_duplicate_names_and_tiny_chunks() -> None:
    with pytest.raises(ValueError, match="twice"):
        plan_layout([("a", torch.ones(1)), ("a", torch.ones(1))], 1024)
    with pytest.raises(ValueError, match="at least"):
        plan_layout([("a", torch.ones(1))], 8)


def test_receive_buffers_are_reused_only_when_nothing_views_them() -> None:
    """A streaming consumer runs on a few buffers; one that keeps tensors still sees correct values."""
    named = {f"t{i}": torch.full((200,), float(i)) for i in range(20)}  # 800 B each, 1 per 1 KiB unit
    layout, units = pack(named.items(), 1024)
    pool = BufferPool(layout.chunk_bytes, torch.device("cpu"))
    unpacker = Unpacker(layout, pool)
    kept = {}
    for index, data in enumerate(units):
        unpacker.target(index).copy_(data)
        for name, tensor in unpacker.complete(index):
            if int(name[1:]) % 2 == 0:
                kept[name] = tensor  # retained view: its buffer must not be refilled
            del tensor
    assert all(torch.equal(kept[name], named[name]) for name in kept)
    # a pure streaming consumer does not grow the pool past its cap
    pool2 = BufferPool(layout.chunk_bytes, torch.device("cpu"))
    unpacker2 = Unpacker(layout, pool2)
    for index, data in enumerate(units):
        unpacker2.target(index).copy_(data)
        for name, tensor in unpacker2.complete(index):
            assert torch.equal(tensor, named[name])
        del tensor
    assert pool2.allocated_bytes() <= 3 * layout.chunk_bytes


def test_manifest_round_trips_through_msgpack() -> None:
    layout = plan_layout(list(make_weights(1).items()), 4096)
    for manifest in (messages.Manifest("p-1", 7, layout), messages.Manifest("p-1", 7, layout, "learner-b2")):
        assert messages.decode(messages.encode(manifest)) == manifest
    with pytest.raises(msgspec.DecodeError):
        messages.decode(b"\x01garbage")


def test_config_validation() -> None:
    assert WeightSyncConfig().chunk_bytes == 32 << 20
    with pytest.raises(ValueError, match="timeout_s"):
        WeightSyncConfig(timeout_s=0).validate("weights")
    with pytest.raises(ValueError, match="backend"):
        WeightSender("127.0.0.1", config=WeightSyncConfig(backend="mpi"))
    with pytest.raises(ValueError, match="peer_timeout_s"):
        WeightSyncConfig(heartbeat_s=1.0, peer_timeout_s=1.5).validate("weights")


def test_backend_resolution_on_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU-only expectations")
    assert resolve_backend("auto") == "gloo" and resolve_backend("gloo") == "gloo"
    with pytest.raises(ValueError, match="nccl"):
        resolve_backend("nccl")


def test_receiver_without_learner_never_blocks() -> None:
    """No learner at the endpoint: poll() returns at once, close() returns promptly."""
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = WeightSyncConfig(join_retry_s=0.05)
    # the bounds: far above what a loaded machine adds to a call that does not wait, far below every deadline
    # the receiver could wait out instead (its transfer, ready and peer timeouts, the default 30, 120 and 10 s)
    assert min(config.timeout_s, config.ready_timeout_s, config.peer_timeout_s) >= 10
    receiver = WeightReceiver(f"tcp://127.0.0.1:{port}", "lonely", lambda named, version, incarnation: None,
                              config=config).start()
    try:
        start = time.monotonic()
        assert receiver.poll() is None and not receiver.connected and receiver.version is None
        assert time.monotonic() - start < 2.0
        time.sleep(0.3)  # a few Join attempts with backoff
    finally:
        start = time.monotonic()
        receiver.close()
        assert time.monotonic() - start < 5.0


def test_curve_keeps_unknown_rollouts_out_of_the_weight_sync() -> None:
    """With CURVE keys, a rollout without the cluster's client key never joins (so never learns the store
    port or a pair id), while a trusted one gets the weights; a non-loopback bind without keys is refused."""
    from drmas.runtime.netsec import CurveClientKeys, CurveKeys, generate_keypair

    server_public, server_secret = generate_keypair()
    client_public, client_secret = generate_keypair()
    stranger_public, stranger_secret = generate_keypair()
    with pytest.raises(ValueError, match="without CURVE"):
        WeightSender("0.0.0.0", config=WeightSyncConfig(**CFG))
    weights = make_weights(seed=3)
    sender = WeightSender("127.0.0.1", config=WeightSyncConfig(**CFG), current_weights=lambda: (7, list(weights.items())),
                          curve=CurveKeys(server_public, server_secret, frozenset({client_public})),
                          incarnation="learner-a1").start()
    got: dict[str, dict] = {}
    incarnations: dict[str, str] = {}

    def apply(name, named, incarnation):
        incarnations[name] = incarnation
        got.setdefault(name, {k: v.clone() for k, v in named})

    receivers = {
        name: WeightReceiver(sender.endpoint, name,
                             lambda named, version, incarnation, name=name: apply(name, named, incarnation),
                             config=WeightSyncConfig(**CFG), curve=curve).start()
        for name, curve in (("trusted", CurveClientKeys(client_public, client_secret, server_public)),
                            ("stranger", CurveClientKeys(stranger_public, stranger_secret, server_public)),
                            ("plain", None))
    }
    try:
        deadline = time.monotonic() + 20
        while "trusted" not in got and time.monotonic() < deadline:
            for receiver in receivers.values():
                receiver.poll()
            time.sleep(0.05)
        for _ in range(20):  # the others have had every chance to join meanwhile
            for receiver in receivers.values():
                receiver.poll()
            time.sleep(0.05)
        assert digests(got["trusted"]) == digests(weights)
        assert receivers["trusted"].version == 7 and incarnations["trusted"] == "learner-a1"  # it names the weights
        assert receivers["stranger"].version is None and receivers["plain"].version is None
        assert set(got) == {"trusted"} and sender.receivers() == {"trusted": 7}
    finally:
        for receiver in receivers.values():
            receiver.close()
        sender.close()


# ====================================================================================== processes


@pytest.mark.e2e
def test_two_receivers_get_identical_tensors() -> None:
    w0 = make_weights(0)
    with cluster() as c, learner(w0, 0) as s:
        c.receiver(s.endpoint, "r0")
        c.receiver(s.endpoint, "r1", poll_mode=True)  # one thread-mode, one poll-mode rollout
        for seen in c.wait_for({"r0": 0, "r1": 0}).values():  # join sync: the current weights at once
            assert seen == digests(w0)
        w1 = make_weights(1)
        report = s.push(w1, 1)
        assert report.receivers_ok == ["r0", "r1"] and report.receivers_dropped == []
        assert report.bytes == sum(t.numel() * t.element_size() for n, t in w1.items() if n != "lm_head.weight")
        for seen in c.wait_for({"r0": 1, "r1": 1}).values():
            assert seen == digests(w1)
        assert s.sender.receivers() == {"r0": 1, "r1": 1}


@pytest.mark.e2e
def test_chunk_smaller_than_one_tensor() -> None:
    """6 MB tensor in 1 MB units (sliced), plus small tensors packed around it."""
    w0 = make_weights(0, big_mb=6.0)
    with cluster() as c, learner(w0, 0, chunk_mb=1.0) as s:
        c.receiver(s.endpoint, "r0")
        assert c.wait_for({"r0": 0})["r0"] == digests(w0)
        w1 = make_weights(1, big_mb=6.0)
        report = s.push(w1, 1)
        assert report.receivers_ok == ["r0"], report.errors
        assert c.wait_for({"r0": 1})["r0"] == digests(w1)


@pytest.mark.e2e
def test_late_joiner_gets_current_version_immediately() -> None:
    with cluster() as c, learner(make_weights(0), 0) as s:
        c.receiver(s.endpoint, "r0")
        c.wait_for({"r0": 0})
        w3 = make_weights(3)
        assert s.push(w3, 3).receivers_ok == ["r0"]
        c.wait_for({"r0": 3})
        c.receiver(s.endpoint, "late")
        assert c.wait_for({"late": 3})["late"] == digests(w3)


@pytest.mark.e2e
def test_killed_receiver_is_dropped_and_the_push_goes_on() -> None:
    with cluster() as c, learner(make_weights(0), 0) as s:
        c.receiver(s.endpoint, "r0")
        c.receiver(s.endpoint, "victim")
        c.wait_for({"r0": 0, "victim": 0})
        s.wait_acked({"r0": 0, "victim": 0})
        c.kill("victim")
        start = time.monotonic()
        report = s.push(make_weights(1), 1)
        assert time.monotonic() - start < CFG["timeout_s"]  # its sockets closed: no deadline was waited out
        assert report.receivers_ok == ["r0"] and report.receivers_dropped == ["victim"], report
        c.wait_for({"r0": 1})
        assert set(s.sender.receivers()) == {"r0"}


@pytest.mark.e2e
def test_receiver_killed_during_a_transfer() -> None:
    """A rollout dies while receiving (10 MB, more than the socket buffers hold, consumed slowly): the push
    completes for the other one within the timeout."""
    w1 = make_weights(1, layers=40)
    with cluster() as c, learner(make_weights(0), 0, chunk_mb=0.25) as s:
        c.receiver(s.endpoint, "r0")
        c.receiver(s.endpoint, "slow", slow_s=0.05)  # ~50 tensors -> ~2.5 s inside apply
        c.wait_for({"r0": 0, "slow": 0}, timeout=40)
        s.wait_acked({"r0": 0, "slow": 0})
        killer = c.kill_once_started("slow")  # mid-transfer: it has started to take the push
        try:
            start = time.monotonic()
            report = s.push(w1, 1)
        finally:
            killer.join()
        assert time.monotonic() - start < CFG["timeout_s"]  # its sockets closed: no deadline was waited out
        assert report.receivers_ok == ["r0"] and report.receivers_dropped == ["slow"], report
        assert c.wait_for({"r0": 1})["r0"] == digests(w1)


@pytest.mark.e2e
def test_restarted_receiver_rejoins_with_current_weights() -> None:
    with cluster() as c, learner(make_weights(0), 0) as s:
        c.receiver(s.endpoint, "r0")
        c.wait_for({"r0": 0})
        s.wait_acked({"r0": 0})
        c.kill("r0")
        w5 = make_weights(5)
        report = s.push(w5, 5)  # nobody left (or dropped now): must not hang
        assert report.receivers_ok == []
        c.receiver(s.endpoint, "r0")  # same id: replaces the dead pair
        assert c.wait_for({"r0": 5})["r0"] == digests(w5)
        assert s.push(make_weights(6), 6).receivers_ok == ["r0"]


@pytest.mark.e2e
def test_apply_failure_is_reported_and_the_pair_survives() -> None:
    with cluster() as c, learner(make_weights(0), 0) as s:
        c.receiver(s.endpoint, "bad", poll_mode=True, fail_names=("layer.0.mask",))
        c.wait_for({"bad": -1})  # the join sync failed in apply; poll() re-raised it
        report = s.push(make_weights(1), 1)
        assert report.receivers_failed == ["bad"] and "unknown weight" in report.errors["bad"]
        assert report.receivers_dropped == []
        c.wait_for({"bad": -1})
        assert set(s.sender.receivers()) == {"bad"}


@pytest.mark.e2e
def test_restarted_sender_on_same_ports_resyncs_receivers() -> None:
    with cluster() as c:
        endpoint, control_port, store_port = c.sender_process(0, 0, seed=0, version=0)
        c.receiver(endpoint, "r0")
        c.receiver(endpoint, "r1")
        c.wait_for({"r0": 0, "r1": 0}, timeout=40)
        c.kill("sender")  # the learner crashes
        w9 = make_weights(9)
        with learner(w9, 9, control_port=control_port, store_port=store_port) as s:
            assert s.endpoint == endpoint
            for seen in c.wait_for({"r0": 9, "r1": 9}).values():
                assert seen == digests(w9)
            report = s.push(make_weights(10), 10)
            assert report.receivers_ok == ["r0", "r1"], report


@pytest.mark.e2e
def test_sender_killed_during_a_transfer_then_restarted() -> None:
    """The learner dies while a rollout is receiving: the rollout drops the broken pair, re-joins the
    successor on the same ports and gets its weights."""
    with cluster() as c:
        endpoint, control_port, store_port = c.sender_process(0, 0, seed=0, version=0, layers=40)
        c.receiver(endpoint, "r0", slow_s=0.05)  # the 10 MB join sync takes ~2.5 s to consume
        c.wait_for({"r0": STARTED})
        time.sleep(0.3)
        c.kill("sender")
        w9 = make_weights(9)
        with learner(w9, 9, control_port=control_port, store_port=store_port):
            assert c.wait_for({"r0": 9})["r0"] == digests(w9)
