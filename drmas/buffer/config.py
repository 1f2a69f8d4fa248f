"""Configuration of the trajectory buffer and its clients, and the CURVE key material they use.

`BufferConfig` is a plain dataclass with help text per field so it can be hooked into the main
OmegaConf schema unchanged. Key *material* (`CurveKeys`, `CurveClientKeys`) is kept out of it: the
config only names key files, and the files are read where the sockets are made.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

import zmq
import zmq.auth


def _f(default: Any, help: str) -> Any:
    """A dataclass field carrying its help text (same convention as `drmas.config.schema`)."""
    return field(default=default, metadata={"help": help})


@dataclass
class BufferConfig:
    producer_endpoint: str = _f(
        "tcp://127.0.0.1:5601",
        "ZeroMQ endpoint where rollout processes push episodes and ask for admission (port 0 = any free "
        "port). A non-loopback tcp address requires CURVE keys.",
    )
    consumer_endpoint: str = _f(
        "tcp://127.0.0.1:5602",
        "ZeroMQ endpoint where learners pull agent groups and report versions (port 0 = any free port).",
    )
    capacity_samples: int = _f(
        4096,
        "Samples the buffer holds before it stops acknowledging new groups (producers then slow down; "
        "nothing is dropped for lack of space).",
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

    def validate(self) -> None:
        """Fail early, naming the field, instead of deep inside socket setup."""
        positive = ("capacity_samples", "max_message_bytes", "window", "incomplete_timeout_s", "lease_timeout_s",
                    "producer_timeout_s",
                    "request_timeout_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"buffer.{name} must be > 0, got {getattr(self, name)}")
        if self.max_running_groups is not None and self.max_running_groups < 1:
            raise ValueError(f"buffer.max_running_groups must be >= 1 or null, got {self.max_running_groups}")
        server_curve = (self.curve_server_secret_file, self.curve_authorized_keys_dir)
        if (server_curve[0] is None) != (server_curve[1] is None):
            raise ValueError("buffer.curve_server_secret_file and buffer.curve_authorized_keys_dir go together")

    def server_curve(self) -> Optional["CurveKeys"]:
        """The buffer's CURVE keys read from the configured files, or None when CURVE is off."""
        if self.curve_server_secret_file is None or self.curve_authorized_keys_dir is None:
            return None
        return CurveKeys.from_files(self.curve_server_secret_file, self.curve_authorized_keys_dir)

    def client_curve(self) -> Optional["CurveClientKeys"]:
        """A client's CURVE keys read from the configured files, or None when CURVE is off."""
        if self.curve_client_secret_file is None or self.curve_server_public_file is None:
            return None
        return CurveClientKeys.from_files(self.curve_client_secret_file, self.curve_server_public_file)

    @classmethod
    def help(cls) -> dict[str, str]:
        """Field name -> help text, for CLI listings."""
        return {f.name: f.metadata["help"] for f in fields(cls)}


@dataclass(frozen=True)
class CurveKeys:
    """The buffer's CURVE identity and the client public keys it lets in (all z85-encoded)."""

    public: bytes
    secret: bytes
    allowed_clients: frozenset[bytes]

    @classmethod
    def from_files(cls, secret_file: str, authorized_keys_dir: str) -> "CurveKeys":
        public, secret = zmq.auth.load_certificate(secret_file)
        if secret is None:
            raise ValueError(f"{secret_file} holds no secret key (use the *.key_secret certificate)")
        allowed = frozenset(
            zmq.auth.load_certificate(str(path))[0] for path in sorted(Path(authorized_keys_dir).glob("*.key"))
        )
        if not allowed:
            raise ValueError(f"no client public keys (*.key) in {authorized_keys_dir}: nobody could connect")
        return cls(public=public, secret=secret, allowed_clients=allowed)


@dataclass(frozen=True)
class CurveClientKeys:
    """A client's CURVE key pair plus the buffer's public key it expects (all z85-encoded)."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def from_files(cls, secret_file: str, server_public_file: str) -> "CurveClientKeys":
        public, secret = zmq.auth.load_certificate(secret_file)
        if secret is None:
            raise ValueError(f"{secret_file} holds no secret key (use the *.key_secret certificate)")
        server_public, _ = zmq.auth.load_certificate(server_public_file)
        return cls(public=public, secret=secret, server_public=server_public)


def generate_keypair() -> tuple[bytes, bytes]:
    """A fresh (public, secret) z85 CURVE key pair; `zmq.auth.create_certificates` writes files."""
    return zmq.curve_keypair()


def is_local_endpoint(endpoint: str) -> bool:
    """Whether only this machine can reach `endpoint` (loopback tcp, ipc, inproc).

    Anything else (a wildcard ``*``, ``0.0.0.0``, an interface name or a routable address) exposes the
    buffer to the network, where unauthenticated peers could inject training data.
    """
    parts = urlsplit(endpoint)
    if parts.scheme in ("ipc", "inproc"):
        return True
    if parts.scheme != "tcp":
        return False
    return is_loopback_host(parts.netloc.rsplit(":", 1)[0].strip("[]"))


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name or address, no port) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_curve_authenticator(context: zmq.Context, allowed_clients: frozenset[bytes]):
    """Start ZeroMQ's ZAP handler on `context` so CURVE servers there admit only `allowed_clients`."""
    import zmq.auth.thread

    auth = zmq.auth.thread.ThreadAuthenticator(context, log=logging.getLogger("drmas.curve"))
    auth.start()
    auth.configure_curve_callback("*", credentials_provider=_AllowList(allowed_clients))
    return auth


class _AllowList:
    """ZAP credentials provider: a client may connect only with one of the allowed public keys."""

    def __init__(self, allowed: frozenset[bytes]) -> None:
        self._allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self._allowed

