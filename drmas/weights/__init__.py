"""The weight channel: a learner pushes versioned weights to the rollout processes serving its model.

`WeightSender` (learner) and `WeightReceiver` (rollout) talk over ZeroMQ for control and over one
two-rank torch.distributed group per rollout (gloo on CPU, NCCL on GPU) for the tensor bytes, sent in
chunks. Rollouts may join late, leave, die and restart at any time; see ``sender.py`` for the protocol.
"""

from drmas.weights.chunks import Layout, pack, plan_layout, unpack
from drmas.weights.config import WeightSyncConfig
from drmas.weights.receiver import ApplyFn, WeightReceiver
from drmas.weights.sender import CurrentWeights, PushReport, WeightSender
from drmas.weights.source import LiveParameters, NamedTensors, WeightSource, as_source

__all__ = [
    "ApplyFn",
    "CurrentWeights",
    "Layout",
    "LiveParameters",
    "NamedTensors",
    "PushReport",
    "WeightReceiver",
    "WeightSender",
    "WeightSource",
    "WeightSyncConfig",
    "as_source",
    "pack",
    "plan_layout",
    "unpack",
]
