"""The weight channel: a learner pushes versioned weights to the rollout processes serving its model.

`WeightSender` (learner side, `drmas.weights.learner`) and `WeightReceiver` (rollout side,
`drmas.weights.rollout`) talk over ZeroMQ for control and over one two-rank torch.distributed group per
rollout (gloo on CPU, NCCL on GPU) for the tensor bytes, sent in chunks. Rollouts may join late, leave, die
and restart at any time; see ``learner/sender.py`` for the protocol. What both sides share sits here: the
chunk layout (``chunks.py``), the control messages (``messages.py``), the pair groups and outbox
(``transport.py``) and the relay chain (``relay.py``). Settings: `drmas.config.weights.WeightSyncConfig`.
"""

from __future__ import annotations

from drmas.weights.chunks import Layout, pack, plan_layout, unpack
from drmas.weights.learner.sender import CurrentWeights, PushReport, WeightSender
from drmas.weights.learner.source import LiveParameters, NamedTensors, WeightSource, as_source
from drmas.weights.rollout.receiver import ApplyFn, WeightReceiver

__all__ = [
    "ApplyFn", "CurrentWeights", "Layout", "LiveParameters", "NamedTensors", "PushReport", "WeightReceiver",
    "WeightSender", "WeightSource", "as_source", "pack", "plan_layout", "unpack",
]
