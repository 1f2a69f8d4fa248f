"""The trajectory buffer: per-agent queues of complete GRPO groups between rollouts and learners.

`TrajectoryBuffer` is the server; `BufferProducer` and `BufferConsumer` are its clients; the wire format
is in `drmas.buffer.messages` (its framing on ZeroMQ in `drmas.buffer.framing`). Nothing here imports torch or
knows about models: samples stay msgpack.
"""

from drmas.buffer.client import BufferConsumer, BufferProducer, BufferRejected, Rejection
from drmas.buffer.messages import AgentGroup, Stats
from drmas.buffer.router import InsecureEndpointError
from drmas.buffer.server import TrajectoryBuffer
from drmas.buffer.store import QueuedGroup
from drmas.config.buffer import BufferConfig

__all__ = [
    "AgentGroup",
    "BufferConfig",
    "BufferConsumer",
    "BufferProducer",
    "BufferRejected",
    "InsecureEndpointError",
    "QueuedGroup",
    "Rejection",
    "Stats",
    "TrajectoryBuffer",
]
