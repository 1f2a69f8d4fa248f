"""The weight channel: a learner pushes versioned weights to the rollout processes serving its model.

`WeightSender` (learner) and `WeightReceiver` (rollout) talk over ZeroMQ for control and over one
two-rank torch.distributed group per rollout (gloo on CPU, NCCL on GPU) for the tensor bytes, sent in
chunks. Rollouts may join late, leave, die and restart at any time; see ``sender.py`` for the protocol.

The names below are resolved on first use: the config schema imports `drmas.weights.config`, and a
process that only needs the configuration (the buffer, `drmas config`) must not pay for torch's import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "Layout": "chunks", "pack": "chunks", "plan_layout": "chunks", "unpack": "chunks",
    "WeightSyncConfig": "config",
    "ApplyFn": "receiver", "WeightReceiver": "receiver",
    "CurrentWeights": "sender", "PushReport": "sender", "WeightSender": "sender",
    "LiveParameters": "source", "NamedTensors": "source", "WeightSource": "source", "as_source": "source",
}

__all__ = [  # spelled out, so linters and readers see the exports without running `_EXPORTS`
    "ApplyFn", "CurrentWeights", "Layout", "LiveParameters", "NamedTensors", "PushReport", "WeightReceiver",
    "WeightSender", "WeightSource", "WeightSyncConfig", "as_source", "pack", "plan_layout", "unpack",
]

if TYPE_CHECKING:
    from drmas.weights.chunks import Layout, pack, plan_layout, unpack
    from drmas.weights.config import WeightSyncConfig
    from drmas.weights.receiver import ApplyFn, WeightReceiver
    from drmas.weights.sender import CurrentWeights, PushReport, WeightSender
    from drmas.weights.source import LiveParameters, NamedTensors, WeightSource, as_source


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"drmas.weights.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
