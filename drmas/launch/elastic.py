"""`drmas rollouts add|remove N`: change the number of rollouts of a running Ray job.

The driver of a `pipeline.launcher=ray` run owns its processes, so the command does not start anything
itself: it finds the run's named control actor (`RolloutControl`, namespace "drmas", name
`pipeline.ray.control_name`) on the cluster and leaves a request there; the driver takes it on its next
supervision round and starts (or stops, newest first) rollout actors. Nothing else has to follow: the
buffer admits groups per producer as producers come and go, and a new rollout joins every learner's weight
fan-out and is handed the current weights before it generates, as a restarted one is.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NAMESPACE = "drmas"


def use_ray_token_if_present(address) -> bool:
    """Connect with Ray's token authentication when a token is at hand. Ray turns it on by itself for a
    cluster it finds (`auto`) but not for an explicit address, where a cluster started with a token (the
    default for a local Ray in Ray 2.60) would then refuse the connection with `InvalidAuthToken`. Ray reads
    the mode when it is imported: call this first (or make Ray read its config again). Returns whether it
    turned token mode on."""
    if address in (None, "auto") or "RAY_AUTH_MODE" in os.environ:
        return False
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or \
            (Path.home() / ".ray" / "auth_token").is_file():
        os.environ["RAY_AUTH_MODE"] = "token"
        return True
    return False


class RolloutControl:
    """The run's mailbox on the cluster (decorated with `ray.remote` by the driver)."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.running: list[str] = []

    def request(self, delta: int) -> list[str]:
        """Queue a change of `delta` rollouts; returns the rollouts running now."""
        self.pending.append(delta)
        return list(self.running)

    def take(self, running: list[str]) -> list[int]:
        """The driver's side: hand over queued changes and record the rollouts running."""
        pending, self.pending = self.pending, []
        self.running = list(running)
        return pending


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `rollouts` on the `drmas` sub-command parsers (`args.func(args)` runs it)."""
    parser = subparsers.add_parser("rollouts", help="add or remove rollouts of a running pipeline.launcher=ray job")
    parser.add_argument("action", choices=("add", "remove"))
    parser.add_argument("count", type=int, help="how many rollouts to add or remove (>= 1)")
    parser.add_argument("--address", default="auto", help="Ray cluster of the run (default: auto, the cluster of "
                        "this machine; the run prints its address)")
    parser.add_argument("--name", default="drmas", help="the run's pipeline.ray.control_name (default: drmas)")
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    if args.count < 1:
        print(f"drmas rollouts: count must be >= 1, got {args.count}", file=sys.stderr)
        return 2
    use_ray_token_if_present(args.address)  # before Ray reads its config
    try:
        import ray
    except ImportError:
        print("drmas rollouts: needs Ray (pip install 'drmas[ray]')", file=sys.stderr)
        return 2
    import logging

    try:
        ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        print(f"drmas rollouts: no Ray cluster at --address {args.address}: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            control = ray.get_actor(args.name, namespace=NAMESPACE)
        except ValueError:
            print(f"drmas rollouts: no running drmas job named {args.name!r} on the cluster at {args.address} "
                  "(pipeline.ray.control_name; is the run using pipeline.launcher=ray?)", file=sys.stderr)
            return 2
        delta = args.count if args.action == "add" else -args.count
        running = ray.get(control.request.remote(delta), timeout=30)
        print(f"requested: {args.action} {args.count} rollout(s); running now: {', '.join(running) or 'none'}")
        return 0
    finally:
        ray.shutdown()
