"""Who may reach a socket: loopback checks and CURVE key material, shared by every networked part.

The trajectory buffer, the weight-sync control plane and the retrieval server all listen on TCP. Each
refuses (or warns about) a non-loopback bind without authentication, and the ZeroMQ sockets authenticate
clients with CURVE. The checks and the key handling live here, once, so that none of those subsystems
imports another's internals to get them.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth

from drmas.config.buffer import BufferConfig


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



def server_keys(config: BufferConfig) -> CurveKeys | None:
    """The buffer's CURVE keys read from the files `config` names, or None when CURVE is off."""
    if config.curve_server_secret_file is None or config.curve_authorized_keys_dir is None:
        return None
    return CurveKeys.from_files(config.curve_server_secret_file, config.curve_authorized_keys_dir)


def client_keys(config: BufferConfig) -> CurveClientKeys | None:
    """A client's CURVE keys read from the files `config` names, or None when CURVE is off."""
    if config.curve_client_secret_file is None or config.curve_server_public_file is None:
        return None
    return CurveClientKeys.from_files(config.curve_client_secret_file, config.curve_server_public_file)
