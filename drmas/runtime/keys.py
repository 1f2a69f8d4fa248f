"""`drmas keys DIR [--clients N] [--force]`: CURVE certificates for a pipeline that crosses machines.

Any non-loopback bind of the trajectory buffer or a learner's weight-sync socket requires CURVE keys, and
getting four `pipeline.buffer.curve_*` settings right by hand (which file is secret, which directory the
buffer scans for `*.key`, which public key a client expects) is where a first multi-machine run trips.
This command writes one server pair and N client pairs in the layout those settings expect and prints the
exact overrides for each side:

    DIR/server/server.key            the buffer's public key: every client's curve_server_public_file
    DIR/server/server.key_secret     the buffer's (and the learners') secret: curve_server_secret_file
    DIR/authorized_clients/*.key     the client public keys the buffer and learners let in
    DIR/clients/client-<i>.key_secret  client i's pair (give each rollout/learner machine its own)

The learners serve weights with the server identity and pull from the buffer as clients, so a learner's
config sets all four; the buffer needs the server side only, a rollout the client side only.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import zmq.auth

from drmas.runtime.netsec import CurveClientKeys, CurveKeys

SERVER_NAME = "server"
CLIENT_PREFIX = "client-"
KEY_FIELDS = ("curve_server_secret_file", "curve_authorized_keys_dir", "curve_client_secret_file",
              "curve_server_public_file")
_PREFIX = "pipeline.buffer."


@dataclass(frozen=True)
class KeyLayout:
    """Where `drmas keys` puts each certificate under one directory."""

    root: Path

    @property
    def server_dir(self) -> Path:
        return self.root / "server"

    @property
    def authorized_dir(self) -> Path:
        return self.root / "authorized_clients"

    @property
    def clients_dir(self) -> Path:
        return self.root / "clients"

    @property
    def server_public(self) -> Path:
        return self.server_dir / f"{SERVER_NAME}.key"

    @property
    def server_secret(self) -> Path:
        return self.server_dir / f"{SERVER_NAME}.key_secret"

    def client_secret(self, index: int) -> Path:
        return self.clients_dir / f"{CLIENT_PREFIX}{index}.key_secret"

    def existing(self) -> list[Path]:
        """Certificate files already in the layout (what a new generation would replace)."""
        return sorted(p for d in (self.server_dir, self.authorized_dir, self.clients_dir) if d.is_dir()
                      for p in d.iterdir() if p.suffix in (".key", ".key_secret"))

    def server_overrides(self) -> list[str]:
        """Overrides of the serving side: the buffer, and each learner (its weight-sync socket)."""
        return [f"{_PREFIX}curve_server_secret_file={self.server_secret}",
                f"{_PREFIX}curve_authorized_keys_dir={self.authorized_dir}"]

    def client_overrides(self, index: int) -> list[str]:
        """Overrides of client `index`: a rollout, or a learner pulling from the buffer."""
        return [f"{_PREFIX}curve_client_secret_file={self.client_secret(index)}",
                f"{_PREFIX}curve_server_public_file={self.server_public}"]


def generate_keys(root: Path, clients: int, force: bool = False) -> KeyLayout:
    """Write a server pair and `clients` client pairs under `root`; FileExistsError when keys are there
    already and not `force` (overwriting a live server key would lock every running client out).

    With `force`, the old certificates are removed first, so no client key of an earlier generation stays
    authorised.
    """
    if clients < 1:
        raise ValueError(f"--clients: at least one client key pair is needed, got {clients}")
    layout = KeyLayout(root.expanduser().resolve())
    old = layout.existing()
    if old and not force:
        raise FileExistsError(
            f"{layout.root} already holds CURVE keys ({', '.join(str(p) for p in old[:3])}"
            f"{', ...' if len(old) > 3 else ''}); pass --force to replace them all (clients using them will be "
            "locked out) or choose another directory"
        )
    for directory in (layout.server_dir, layout.authorized_dir, layout.clients_dir):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    layout.server_dir.chmod(0o700)
    layout.clients_dir.chmod(0o700)
    _create_pair(layout.server_dir, SERVER_NAME)
    for index in range(clients):
        public = _create_pair(layout.clients_dir, f"{CLIENT_PREFIX}{index}")
        shutil.copyfile(public, layout.authorized_dir / public.name)
    _check_loadable(layout, clients)
    return layout


def _create_pair(directory: Path, name: str) -> Path:
    """One certificate pair (zmq.auth format); the secret file readable by its owner only. Returns the public file."""
    public, secret = zmq.auth.create_certificates(str(directory), name)
    Path(secret).chmod(0o600)
    return Path(public)


def _check_loadable(layout: KeyLayout, clients: int) -> None:
    """Read the files back the way the buffer and its clients will, so a bad layout fails here, not there."""
    server = CurveKeys.from_files(str(layout.server_secret), str(layout.authorized_dir))
    for index in range(clients):
        client = CurveClientKeys.from_files(str(layout.client_secret(index)), str(layout.server_public))
        if client.public not in server.allowed_clients or client.server_public != server.public:
            raise RuntimeError(f"{layout.root}: client {index}'s keys do not match the server's authorised keys")


def _shell(overrides: list[str]) -> str:
    """Overrides as shell words (a key directory with a space in its path stays one argument)."""
    return " ".join(shlex.quote(o) for o in overrides)


def instructions(layout: KeyLayout, clients: int) -> str:
    """What to put in the config on each side, as `key=value` overrides (also valid in the YAML file)."""
    lines = [
        f"CURVE keys written to {layout.root}",
        "",
        "buffer (drmas-buffer) and every learner (drmas-learner serves weights with the same keys):",
        "  " + _shell(layout.server_overrides()),
        "",
        "clients, one key pair per machine: each rollout (drmas-rollout) and each learner (it pulls from the buffer):",
    ]
    lines += [f"  client {i}: " + _shell(layout.client_overrides(i)) for i in range(clients)]
    lines += [
        "",
        "a learner sets both the server and a client's overrides; `drmas run` on one machine sets all four:",
        "  " + _shell(layout.server_overrides() + layout.client_overrides(0)),
        "",
        f"Copy {layout.server_public} and one clients/ pair to each client machine; keep "
        f"{layout.server_secret} on the buffer and learner machines only.",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- command line


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `keys` on the `drmas` sub-command parsers (`args.func(args)` runs it)."""
    parser = subparsers.add_parser(
        "keys", help="generate CURVE certificates for the buffer and its clients and print the config overrides")
    parser.add_argument("dir", type=Path, help="directory to write the certificates into")
    parser.add_argument("--clients", type=int, default=1, help="client key pairs to generate (default 1)")
    parser.add_argument("--force", action="store_true", help="replace keys already in DIR (old clients are locked out)")
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run `drmas keys`; exit code 2 (and a message on stderr) when keys exist or --clients is wrong."""
    try:
        layout = generate_keys(args.dir, args.clients, force=args.force)
    except (FileExistsError, ValueError, OSError) as exc:
        print(f"drmas keys: {exc}", file=sys.stderr)
        return 2
    print(instructions(layout, args.clients))
    return 0
