"""`pipeline.buffer`: the trajectory buffer and its clients.

Key *material* is kept out of it: the config only names CURVE key files, which are read where the sockets
are made (`drmas.runtime.netsec.server_keys` / `client_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from drmas.config.fields import Section
from drmas.config.fields import help_field as _f


@dataclass
class BufferConfig(Section):
    producer_endpoint: str = _f(
        "tcp://127.0.0.1:0",
        "ZeroMQ endpoint where rollout processes push episodes and ask for admission. Port 0: `drmas run` picks "
        "a free port (so runs on one machine never collide); processes started by hand need a real one (e.g. "
        "tcp://127.0.0.1:5601), the same in every process. A non-loopback tcp address requires CURVE keys.",
    )
    consumer_endpoint: str = _f(
        "tcp://127.0.0.1:0",
        "ZeroMQ endpoint where learners pull agent groups and report versions. Port 0: `drmas run` picks a free "
        "port; processes started by hand need a real one (e.g. tcp://127.0.0.1:5602).",
    )
    capacity_samples: int = _f(
        4096,
        "Samples the buffer holds before it stops acknowledging new groups (producers then slow down; "
        "nothing is dropped for lack of space).",
    )
    max_held_samples: Optional[int] = _f(
        None,
        "Hard limit on samples held (null = 4 x capacity_samples). Producers that respect their window never "
        "reach it; beyond it an episode is refused ('buffer_full') and its group dropped, instead of being "
        "stored first. Must leave room for the groups admission lets run at once.",
    )
    max_sample_tokens: Optional[int] = _f(
        32768,
        "Most prompt + response tokens of one sample; longer ones are refused ('too_long') before a learner "
        "tries to fit them in memory (null = no limit; learners also check their model's positions).",
    )
    max_message_bytes: int = _f(
        64 * 1024 * 1024,
        "Largest message accepted; bigger ones are refused with reason 'oversized'. Beyond 4x this size "
        "libzmq drops the sender's connection without reading the message (memory protection).",
    )
    window: int = _f(8, "Producer side: episodes a rollout process may have sent but not yet acknowledged.")
    incomplete_timeout_s: float = _f(
        600.0,
        "Discard a group that received no new episode for this long while still incomplete (its producer "
        "probably died); counted under 'incomplete_group'.",
    )
    lease_timeout_s: float = _f(
        600.0, "Admitted groups that have not started arriving after this long are returned to the budget."
    )
    producer_timeout_s: float = _f(
        15.0,
        "A producer (rollout) silent for this long is taken for dead: its admitted groups return to the "
        "staleness budget and its unfinished groups are dropped ('producer_gone'). Rollouts heartbeat every "
        "producer_timeout_s / 5 from a thread of their own.",
    )
    max_running_groups: Optional[int] = _f(
        None, "Cap on admitted groups generating at once, across all producers (null = only the staleness bound)."
    )
    validate_samples: bool = _f(
        True,
        "Decode every sample fully at the buffer, so a malformed sample is refused at its producer rather "
        "than breaking a learner's batch; false checks only routing fields (faster, trusted producers).",
    )
    request_timeout_s: float = _f(
        30.0, "Client side: seconds to wait for any reply (beyond a pull's own wait) before raising TimeoutError."
    )
    curve_server_secret_file: Optional[str] = _f(
        None, "Buffer side: CURVE secret certificate (zmq.auth format); enables encryption and authentication."
    )
    curve_authorized_keys_dir: Optional[str] = _f(
        None, "Buffer side: directory of client public certificates (*.key) allowed to connect."
    )
    curve_client_secret_file: Optional[str] = _f(None, "Client side: this client's CURVE secret certificate.")
    curve_server_public_file: Optional[str] = _f(None, "Client side: the buffer's CURVE public certificate.")

    def problems(self, where: str) -> list[str]:
        found = []
        positive = ("capacity_samples", "max_message_bytes", "window", "incomplete_timeout_s", "lease_timeout_s",
                    "producer_timeout_s", "request_timeout_s")
        for name in positive:
            if getattr(self, name) <= 0:
                found.append(f"{where}.{name}: must be > 0, got {getattr(self, name)}")
        if self.max_held_samples is not None and self.max_held_samples < self.capacity_samples:
            found.append(f"{where}.max_held_samples ({self.max_held_samples}) must be >= {where}.capacity_samples "
                         f"({self.capacity_samples}) or null")
        if self.max_sample_tokens is not None and self.max_sample_tokens < 2:
            found.append(f"{where}.max_sample_tokens: must be >= 2 or null, got {self.max_sample_tokens}")
        if self.max_running_groups is not None and self.max_running_groups < 1:
            found.append(f"{where}.max_running_groups: must be >= 1 or null, got {self.max_running_groups}")
        if (self.curve_server_secret_file is None) != (self.curve_authorized_keys_dir is None):
            found.append(f"{where}.curve_server_secret_file and {where}.curve_authorized_keys_dir go together")
        return found

    @property
    def hard_capacity(self) -> int:
        """Samples the buffer never holds more of (see `max_held_samples`)."""
        return self.max_held_samples if self.max_held_samples is not None else 4 * self.capacity_samples

    @classmethod
    def help(cls) -> dict[str, str]:
        """Field name -> help text, for CLI listings."""
        return {f.name: f.metadata["help"] for f in fields(cls)}
