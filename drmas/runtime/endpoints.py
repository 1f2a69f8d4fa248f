"""Where each pipeline process listens and whom it connects to, derived from the config alone.

Every process reads the same `pipeline` section, so a buffer, its learners and any number of rollouts
started by hand on different machines agree on the endpoints without talking first. Port 0 (the default)
means "any free port", which only a launcher can use: it picks the ports and passes them to every child, so
two runs on one machine never collide. A process started by hand refuses port 0 (`require_fixed`), naming
the key to set; a launcher checks the ports a config does fix before any process starts (`unusable_ports`).
"""

from __future__ import annotations

import errno
import socket
from typing import Iterable, Optional
from urllib.parse import urlsplit

from drmas.config.derived import model_ids, split_model
from drmas.config.schema import DrmasConfig

BUFFER_ENDPOINTS = ("producer_endpoint", "consumer_endpoint")


class EndpointError(ValueError):
    """An endpoint a process needs is not fixed (port 0) or not configured; names the config key."""


def learner_address(cfg: DrmasConfig, model: str) -> tuple[str, int]:
    """(host, port) of the weight-sync control socket of `model`'s learner (a model id: an adapter's learner
    takes the host of its model's entry in `learner_hosts` unless it has one of its own)."""
    p = cfg.pipeline
    host = p.learner_hosts.get(model, p.learner_hosts.get(split_model(model)[0], p.learner_host))
    if model in p.learner_ports:
        return host, p.learner_ports[model]
    if p.learner_base_port == 0:
        return host, 0
    return host, p.learner_base_port + model_ids(cfg).index(model)


def learner_endpoint(cfg: DrmasConfig, model: str) -> str:
    host, port = learner_address(cfg, model)
    return f"tcp://{host}:{port}"


def _port(endpoint: str) -> str:
    return endpoint.rsplit(":", 1)[-1]


def require_fixed(cfg: DrmasConfig, buffer: bool = False, learners: Iterable[str] = ()) -> None:
    """Refuse to start on an endpoint others could not find (port 0 outside a launcher), naming each key."""
    bad = []
    if buffer:
        for key in BUFFER_ENDPOINTS:
            endpoint = getattr(cfg.pipeline.buffer, key)
            if endpoint.startswith("tcp://") and _port(endpoint) in ("0", "*"):
                bad.append(f"pipeline.buffer.{key}={endpoint}")
    for model in learners:
        if learner_address(cfg, model)[1] == 0:
            bad.append(f"the weight-sync port of model {model!r} (pipeline.learner_ports.{model} or "
                       "pipeline.learner_base_port)")
    if bad:
        raise EndpointError(
            "port 0 means `drmas run` picks free ports for its children; a process started by hand needs real "
            "ones, the same in every process's config: " + ", ".join(bad) + " (e.g. "
            "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:5601 pipeline.buffer.consumer_endpoint="
            "tcp://127.0.0.1:5602 pipeline.learner_base_port=5610)"
        )


def fixed_ports(cfg: DrmasConfig, models: Iterable[str]) -> list[tuple[str, str, int]]:
    """(config key, host, port) of every endpoint of the run that the config fixes to a port (not 0): the
    buffer's two and the weight-sync port of each learner of `models`."""
    found = []
    for key in BUFFER_ENDPOINTS:
        parts = urlsplit(getattr(cfg.pipeline.buffer, key))
        if parts.scheme == "tcp" and parts.port:
            found.append((f"pipeline.buffer.{key}", parts.hostname or "*", parts.port))
    for model in models:
        host, port = learner_address(cfg, model)
        if port:
            key = f"pipeline.learner_ports.{model}" if model in cfg.pipeline.learner_ports else \
                "pipeline.learner_base_port"
            found.append((key, host, port))
    return found


def bind_problem(host: str, port: int) -> Optional[str]:
    """Why this machine cannot listen on host:port now (None: it can). Binds with SO_REUSEADDR, as ZeroMQ
    and gloo do, so a port a finished run left in TIME_WAIT counts as free, as it is for them."""
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("" if host == "*" else host, port))
        return None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"port {port} is in use on {host} (another run?)"
        return f"cannot listen on {host}:{port} ({exc.strerror or exc})"
    finally:
        probe.close()


def listen_error(cfg: DrmasConfig, exc: Exception, buffer: bool = False, learners: Iterable[str] = ()) -> str:
    """One line for a process started by hand that could not listen (ZeroMQ's bind failed, typically a port
    another process holds), naming the keys of the endpoints it binds instead of a traceback."""
    keys = [f"pipeline.buffer.{key}={getattr(cfg.pipeline.buffer, key)}" for key in BUFFER_ENDPOINTS if buffer]
    keys += [f"the weight-sync port {learner_endpoint(cfg, model)} of model {model!r} (pipeline.learner_ports."
             f"{model} or pipeline.learner_base_port)" for model in learners]
    return (f"cannot listen: {exc}; check {', '.join(keys)}: another process may hold the port (choose another, "
            "the same in every process's config, or let `drmas run` pick free ones)")


def unusable_ports(cfg: DrmasConfig, models: Iterable[str]) -> list[str]:
    """What stops the run's processes on this machine from listening where the config fixes their ports (a
    port in use, an address not of this machine, one port given twice), one message per key."""
    problems, seen = [], {}
    for key, host, port in fixed_ports(cfg, models):
        if port in seen:
            problems.append(f"{key}: port {port} is also the port of {seen[port]}")
            continue
        seen[port] = key
        why = bind_problem(host, port)
        if why is not None:
            problems.append(f"{key}: {why}; set another port, or 0 to let drmas run pick a free one")
    return problems
