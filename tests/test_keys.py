"""`drmas keys`: generated CURVE certificates, used through the printed overrides, let their clients (and
only them) reach a real trajectory buffer over real sockets."""

from __future__ import annotations

import dataclasses
import shlex
import stat
from pathlib import Path
from typing import Iterator

import pytest

from drmas.buffer import BufferConfig, BufferConsumer, BufferProducer, TrajectoryBuffer
from drmas.cli import main
from drmas.config import read_config

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
LOCAL = "tcp://127.0.0.1:0"


def _keys(directory: Path, capsys: pytest.CaptureFixture, *args: str) -> tuple[list[str], list[list[str]]]:
    """Run `drmas keys` and parse what it prints: (server overrides, overrides of each client)."""
    assert main(["keys", str(directory), *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    server = shlex.split(lines[next(i for i, line in enumerate(lines) if line.startswith("buffer")) + 1])
    clients = [shlex.split(line.split(": ", 1)[1]) for line in lines if line.strip().startswith("client ")]
    return server, clients


@pytest.fixture
def buffer_with() -> Iterator:
    """Start a buffer on free loopback ports from a config's `pipeline.buffer`; stopped after the test."""
    started: list[TrajectoryBuffer] = []

    def start(config: BufferConfig) -> TrajectoryBuffer:
        config = dataclasses.replace(config, producer_endpoint=LOCAL, consumer_endpoint=LOCAL)
        buf = TrajectoryBuffer(config, agent_models={"solver": "policy", "verifier": "policy"}).start()
        started.append(buf)
        return buf

    yield start
    for buf in started:
        buf.stop()


def _client_side(overrides: list[str], buf: TrajectoryBuffer, timeout_s: float = 5.0) -> BufferConfig:
    """A client's buffer config: the smoke config plus `overrides`, pointed at the running buffer."""
    config = read_config(SMOKE, overrides).pipeline.buffer
    return dataclasses.replace(config, producer_endpoint=buf.producer_endpoint,
                               consumer_endpoint=buf.consumer_endpoint, request_timeout_s=timeout_s)


def test_printed_overrides_connect_every_client_and_keep_other_keys_out(tmp_path, capsys, buffer_with) -> None:
    server, clients = _keys(tmp_path / "my keys", capsys, "--clients", "2")  # a space: printed quoted
    assert [o.split("=")[0] for o in server] == ["pipeline.buffer.curve_server_secret_file",
                                                 "pipeline.buffer.curve_authorized_keys_dir"]
    assert [[o.split("=")[0] for o in c] for c in clients] == [["pipeline.buffer.curve_client_secret_file",
                                                                "pipeline.buffer.curve_server_public_file"]] * 2
    buf = buffer_with(read_config(SMOKE, server).pipeline.buffer)

    learner = BufferConsumer.from_config(_client_side(clients[0], buf))
    rollout = BufferProducer.from_config(_client_side(clients[1], buf), "rollout-1")
    try:
        assert learner.stats().received_episodes == 0
        assert rollout.stats().received_episodes == 0
    finally:
        learner.close()
        rollout.close()

    _, strangers = _keys(tmp_path / "other", capsys)  # a well-formed key pair the buffer never authorised
    server_public = next(o for o in clients[0] if "curve_server_public_file" in o)
    stranger_secret = next(o for o in strangers[0] if "curve_client_secret_file" in o)
    for overrides in ([stranger_secret, server_public], []):  # an unknown key, and no key at all
        intruder = BufferConsumer.from_config(_client_side(overrides, buf, timeout_s=0.5))
        try:
            with pytest.raises(TimeoutError, match="127.0.0.1"):
                intruder.stats()
        finally:
            intruder.close()


def test_secrets_are_private_and_existing_keys_are_kept_without_force(tmp_path, capsys) -> None:
    keys = tmp_path / "keys"
    _keys(keys, capsys, "--clients", "2")
    server_secret = keys / "server" / "server.key_secret"
    assert stat.S_IMODE(server_secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((keys / "clients" / "client-1.key_secret").stat().st_mode) == 0o600
    assert sorted(p.name for p in (keys / "authorized_clients").iterdir()) == ["client-0.key", "client-1.key"]
    before = server_secret.read_bytes()

    assert main(["keys", str(keys)]) == 2
    err = capsys.readouterr().err
    assert "already holds CURVE keys" in err and "--force" in err
    assert server_secret.read_bytes() == before

    _keys(keys, capsys, "--force")  # one client now: the second's old key must not stay authorised
    assert server_secret.read_bytes() != before
    assert [p.name for p in (keys / "authorized_clients").iterdir()] == ["client-0.key"]
    assert not (keys / "clients" / "client-1.key_secret").exists()


def test_zero_clients_is_refused(tmp_path, capsys) -> None:
    assert main(["keys", str(tmp_path / "keys"), "--clients", "0"]) == 2
    assert "--clients" in capsys.readouterr().err
    assert not (tmp_path / "keys").exists()
