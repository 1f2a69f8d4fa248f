"""Endpoints, ports and CURVE keys of a cluster-placed run (the Ray launcher's hand-out), without a cluster:
the decisions of `drmas.launch.placement` and a real `ProcessHost` (the actor class, used as a plain object)
starting a real buffer on the ports it found."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from drmas.config import read_config
from drmas.config.load import to_yaml
from drmas.launch.placement import add_run_keys, key_files, localize, place_endpoints
from drmas.launch.ray_host import ProcessHost
from drmas.runtime.netsec import client_keys, server_keys

ROOT = Path(__file__).resolve().parents[1]
SMOKE_ASYNC = ROOT / "configs" / "smoke_async.yaml"
PORT_ZERO = ["pipeline.learner_base_port=0", "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0",
             "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0"]
MODELS = ["solver_model", "verifier_model"]


class _NodePorts:
    """Port finder of the placed processes: a distinct real free port per request, and who asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    def __call__(self, name: str, count: int) -> list[int]:
        self.asked.append((name, count))
        return ProcessHost(name).free_ports("127.0.0.1", count)


def test_one_node_keeps_loopback_and_needs_no_keys(tmp_path):
    cfg = read_config(SMOKE_ASYNC, [*PORT_ZERO, "pipeline.learner_ports={verifier_model: 7123}"])
    ports = _NodePorts()
    placed = place_endpoints(cfg, "10.0.0.1", {m: "10.0.0.2" for m in MODELS}, ports, multi_node=False)
    assert placed.pipeline.buffer.producer_endpoint.startswith("tcp://127.0.0.1:")
    assert not placed.pipeline.buffer.consumer_endpoint.endswith(":0")
    assert placed.pipeline.learner_ports["verifier_model"] == 7123  # a fixed port is kept
    assert placed.pipeline.learner_ports["solver_model"] > 0
    assert ports.asked == [("buffer", 2), ("learner-solver_model", 1)]  # found on each process's own node
    assert add_run_keys(placed, MODELS, tmp_path / "keys") is None and not (tmp_path / "keys").exists()
    assert cfg.pipeline.learner_ports == {"verifier_model": 7123}  # the input is not changed


def test_spread_endpoints_get_node_addresses_and_run_keys_that_travel(tmp_path):
    cfg = read_config(SMOKE_ASYNC, PORT_ZERO)
    placed = place_endpoints(cfg, "10.0.0.1", {"solver_model": "10.0.0.2", "verifier_model": "10.0.0.3"},
                             _NodePorts(), multi_node=True)
    assert placed.pipeline.buffer.producer_endpoint.startswith("tcp://10.0.0.1:")
    assert placed.pipeline.learner_hosts == {"solver_model": "10.0.0.2", "verifier_model": "10.0.0.3"}
    driver_keys = tmp_path / "driver" / "keys"
    assert add_run_keys(placed, MODELS, driver_keys) == driver_keys
    files = key_files(driver_keys)
    # a node without the driver's filesystem: the keys arrive as text and are written next to its config
    node = tmp_path / "node"
    local = read_config(localize(to_yaml(placed), str(driver_keys), files, node))
    buf = local.pipeline.buffer
    assert all(str(node / "keys") in getattr(buf, f) for f in ("curve_server_secret_file", "curve_client_secret_file"))
    server, client = server_keys(buf), client_keys(buf)
    assert client.public in server.allowed_clients and client.server_public == server.public
    assert (node / "keys" / "server" / "server.key_secret").stat().st_mode & 0o077 == 0
    # keys the user configured are theirs: none are generated over them
    mine = read_config(SMOKE_ASYNC, PORT_ZERO + [f"pipeline.buffer.{k}={v}" for k, v in (
        ("curve_server_secret_file", buf.curve_server_secret_file),
        ("curve_authorized_keys_dir", buf.curve_authorized_keys_dir))])
    mine = place_endpoints(mine, "10.0.0.1", {m: "10.0.0.2" for m in MODELS}, _NodePorts(), multi_node=True)
    assert add_run_keys(mine, MODELS, tmp_path / "other") is None


@pytest.mark.e2e
def test_process_host_starts_a_buffer_on_the_ports_it_found_and_relays_its_output(tmp_path):
    host = ProcessHost("buffer")
    producer, consumer = host.free_ports("127.0.0.1", 2)
    assert producer != consumer
    cfg = read_config(SMOKE_ASYNC, [f"pipeline.buffer.producer_endpoint=tcp://127.0.0.1:{producer}",
                                    f"pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:{consumer}",
                                    f"trainer.output_dir={tmp_path / 'run'}"])
    host.start("drmas.buffer.main", [], 1, to_yaml(cfg), None, {}, str(ROOT))
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not any("serving producers" in line for line in lines):
            assert time.monotonic() < deadline, lines
            out, rc = host.poll()
            lines += out
            assert rc is None, lines
            time.sleep(0.1)
        assert f"tcp://127.0.0.1:{producer}" in "\n".join(lines)
        host.signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (rc := host.poll()[1]) is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert rc == 0
    finally:
        host.signal(signal.SIGKILL)


def test_plugin_files_travel_to_a_node_that_lacks_them(tmp_path):
    """A Ray host on a node without the driver's filesystem writes the plugin files it was sent and imports
    those copies; a node that has the file (a shared filesystem) imports it where it is."""
    from drmas.assembly import load_config
    from drmas.launch.placement import plugin_files

    driver = tmp_path / "driver" / "carried_plugin.py"
    driver.parent.mkdir()
    driver.write_text("from drmas.api import help_field\n\nCARRIED = True\n")
    cfg = read_config(SMOKE_ASYNC, [f"plugins=[{driver}]"])
    sent = plugin_files(cfg)
    assert sent == {str(driver): driver.read_text()}
    shared = read_config(localize(to_yaml(cfg), None, {}, tmp_path / "shared", sent))
    assert shared.plugins == [str(driver)] and not (tmp_path / "shared" / "plugins").exists()
    driver.unlink()  # as on a node that never had it
    node = tmp_path / "node"
    local = load_config(localize(to_yaml(cfg), None, {}, node, sent))
    assert local.plugins == [str(node / "plugins" / "carried_plugin.py")]
    assert sys.modules["carried_plugin"].CARRIED and sys.modules["carried_plugin"].__file__ == local.plugins[0]
