"""Where each pipeline process listens and whom it connects to, derived from the config alone.

Every process reads the same `pipeline` section, so a buffer, its learners and any number of rollouts
started by hand on different machines agree on the endpoints without talking first. Port 0 means "any free
port", which only the local launcher can use: it picks the ports and passes them to every child.
"""

from __future__ import annotations

from typing import Iterable

from drmas.config.derived import model_ids, split_model
from drmas.config.schema import DrmasConfig


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
    """Refuse to start on an endpoint others could not find (port 0 outside the launcher)."""
    bad = []
    if buffer:
        for key in ("producer_endpoint", "consumer_endpoint"):
            endpoint = getattr(cfg.pipeline.buffer, key)
            if endpoint.startswith("tcp://") and _port(endpoint) in ("0", "*"):
                bad.append(f"pipeline.buffer.{key}={endpoint}")
    for model in learners:
        if learner_address(cfg, model)[1] == 0:
            bad.append(f"the weight-sync port of model {model!r} (pipeline.learner_ports.{model} or "
                       "pipeline.learner_base_port)")
    if bad:
        raise EndpointError(
            "port 0 is only for `drmas run`, which assigns free ports to its children; a process started "
            "by hand needs fixed ports: " + ", ".join(bad)
        )
