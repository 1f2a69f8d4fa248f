"""Rollout side of the weight channel: join a learner, receive versioned weights, hand them to the engine.

A `WeightReceiver` keeps one **link thread** (`drmas.weights.rollout.link`) that joins the learner, keeps the pair
alive and joins again whenever it breaks. So a restarted learner, or a learner that dropped this rollout, is
re-synced without anyone coordinating: the learner's join sync sends the current weights to every (re)joined
rollout.

Who receives the bytes: this process (rank 1 of the pair, the default), handing a streaming iterable to the
apply callback; or, for an engine that implements `WorkerReceivers` (vLLM with several workers, or on GPU),
the engine's workers themselves (ranks 1..N, see `drmas.weights.rollout.member`), with this process keeping only the
control side.

Announced updates are applied by whoever calls `poll()` (or by a background applier thread, see below). The
apply callback receives a *streaming* iterable: chunks are received while it consumes them, so memory stays
at a few chunk buffers whatever the model size (plus, on CPU, the few tensors larger than a chunk, kept
between updates to save page faults), and generation is paused for the transfer time (the engine's
``load_weights`` holds its generate lock while it iterates). The learner only starts broadcasting once the
callback has begun iterating (we then send Ready), so no collective timeout ever has to cover a generation
step.

Which mode the rollout loop should use: **`poll()` between generation steps**. The loop then decides where
versions switch (no update lands in the middle of its step), the update starts as soon as the step ends, and
no second thread competes for the engine lock: Python locks are not fair, so a loop that calls ``generate``
back to back can starve a background thread waiting in ``load_weights`` until the learner's
``ready_timeout_s`` drops the rollout. ``background=True`` (an applier thread) is for engines whose
``generate`` is called from elsewhere with natural gaps (a server) or for tests.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable

import torch

from drmas.config.weights import WeightSyncConfig
from drmas.runtime.netsec import CurveClientKeys
from drmas.weights import messages as msg
from drmas.weights.rollout.link import Link, OwnerJobs, Session, Update
from drmas.weights.rollout.member import WorkerReceivers

log = logging.getLogger(__name__)

ApplyFn = Callable[[Iterable[tuple[str, torch.Tensor]], int, str], None]
"""``apply(named_tensors, version, incarnation)``, e.g. an engine's ``load_weights``; ``incarnation`` names the
learner process that made the weights (see `Manifest`). The tensors are zero-copy views of
receive buffers that are refilled once nothing views them any more: copy each one and let it go (keeping
them is safe, but then every kept buffer is replaced by a new allocation)."""


class WeightReceiver:
    """Receives the weights a `WeightSender` pushes and applies them with ``apply_fn(named_tensors, version, incarnation)``.

    ``endpoint`` is the sender's `endpoint` (``tcp://host:port``). ``model`` ('' = any) is checked by the
    learner. With ``background=False`` (recommended for rollout loops, see the module docstring) updates are
    applied by `poll()`; with ``background=True`` an applier thread applies them as they come.
    """

    def __init__(
        self,
        endpoint: str,
        receiver_id: str,
        apply_fn: ApplyFn,
        *,
        model: str = "",
        background: bool = False,
        config: WeightSyncConfig | None = None,
        curve: CurveClientKeys | None = None,
        workers: WorkerReceivers | None = None,
    ) -> None:
        """``config`` supplies ``join_retry_s`` (the defaults of `WeightSyncConfig` when None); the other timing
        settings come from the learner.
        ``curve``: this rollout's CURVE keys and the learner's (= the buffer's) public key, when CURVE is on.
        ``workers``: an engine whose workers receive the broadcasts themselves (`drmas.weights.rollout.member`);
        ``apply_fn`` is then not used, and whoever calls `poll` must also call `run_engine_jobs` often."""
        self._curve = curve
        self._workers = workers
        self._owner = OwnerJobs(on_submit=self._wake)
        self.endpoint = endpoint
        self.receiver_id = receiver_id
        self.model = model
        self.config = config or WeightSyncConfig()
        self.config.validate("weights")
        self._apply_fn = apply_fn
        self._background = background
        self._cond = threading.Condition()
        self._pending: Update | None = None
        self._version: int | None = None
        self.last_apply_s: float | None = None  # duration of the last apply callback (generation paused)
        self._link: Link | None = None
        self._applier: threading.Thread | None = None
        self._connected = False

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> WeightReceiver:
        self._link = Link(self.endpoint, self.receiver_id, self.model, self.config, self._offer, self._session_changed,
                           curve=self._curve, workers=self._workers, owner=self._owner)
        self._link.start()
        if self._background:
            self._applier = threading.Thread(
                target=self._apply_loop, name=f"drmas-weights-apply-{self.receiver_id}", daemon=True
            )
            self._applier.start()
        return self

    def close(self) -> None:
        """Leave the learner and stop the threads."""
        link, self._link = self._link, None
        if link is None:
            return
        link.stopping.set()
        with self._cond:
            self._cond.notify_all()
        link.join(timeout=self.config.timeout_s + 5)
        if self._applier is not None:
            self._applier.join(timeout=self.config.timeout_s + 5)
        self._owner.run()  # release what the engine's workers still hold

    def __enter__(self) -> WeightReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ public API

    @property
    def version(self) -> int | None:
        """The last version applied (None before the first)."""
        return self._version

    @property
    def connected(self) -> bool:
        return self._connected

    def run_engine_jobs(self) -> None:
        """Build or release the pair ends of the engine's workers, if the link asked for it (call it from the
        thread that drives the engine, between its steps; `poll` does it too). Loads no weights."""
        self._owner.run()

    def poll(self) -> int | None:
        """Apply the announced update, if any, in the calling thread; returns its version, else None at once.

        Transport failures are absorbed (the link re-joins and the learner re-sends); an exception of the
        apply callback itself is re-raised after the learner has been told.
        """
        self._owner.run()
        with self._cond:
            update, self._pending = self._pending, None
        if update is None:
            return None
        if update.session.workers is not None:
            return self._apply_in_workers(update)
        return self._apply(update)

    def wait_for_version(self, version: int, timeout: float) -> bool:
        """Block until a version >= ``version`` was applied (by another thread), or the timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._version is not None and self._version >= version, timeout=timeout
            )

    def has_pending(self) -> bool:
        with self._cond:
            return self._pending is not None

    # ------------------------------------------------------------------------------------------ internals

    def _offer(self, update: Update) -> None:
        """A Manifest arrived (link thread): the next `poll` applies it."""
        with self._cond:
            self._pending = update
            self._cond.notify_all()

    def _session_changed(self, session: Session, active: bool) -> None:
        """(link thread) An update announced on a session that ended can never be received: forget it."""
        self._connected = active
        if not active:
            with self._cond:
                if self._pending is not None and self._pending.session is session:
                    self._pending = None

    def _apply(self, update: Update) -> int | None:
        session, manifest = update.session, update.manifest
        with session.lock:
            if session.broken is not None:
                return None
            def ready() -> msg.Route:
                self._link_send(msg.Ready(session.pair_id, manifest.version))
                return session.take_route(manifest.version, session.member.spec.timeout_s)

            stream = session.member.stream(manifest.layout, on_start=ready, broken=lambda: session.broken)
            error: Exception | None = None
            start = time.monotonic()
            try:
                self._apply_fn(stream.tensors(), manifest.version, manifest.incarnation)
            except Exception as exc:  # reported to the learner below, re-raised unless the transport caused it
                error = exc
            elapsed = time.monotonic() - start
            stream.finish()
            if stream.failed is not None and stream.via_hop:  # the predecessor failed; the pair is fine
                session.member.hops.close()
                log.warning("weights: %s: relay of version %d failed upstream: %s",
                            self.receiver_id, manifest.version, stream.failed)
                self._link_send(msg.Applied(session.pair_id, manifest.version, False, stream.failed,
                                        upstream_failed=True))
                return None
            if stream.failed is not None:
                session.broken = f"transfer of version {manifest.version} failed: {stream.failed}"
                log.warning("weights: %s: %s", self.receiver_id, session.broken)
                return None
            self._link_send(msg.Applied(session.pair_id, manifest.version, error is None, repr(error) if error else "",
                                    forward_error=stream.forward_error or ""))
        if error is not None:
            raise error
        return self._applied(manifest.version, elapsed)

    def _apply_in_workers(self, update: Update) -> int | None:
        """The engine's workers receive and load the update themselves. Any failure there breaks the pair (a
        worker cannot tell the transport's failures from the loader's across the process boundary): the link
        re-joins and the learner's join sync sends the weights again."""
        session, manifest = update.session, update.manifest
        with session.lock:
            workers = session.workers
            if session.broken is not None or workers is None:
                return None
            self._link_send(msg.Ready(session.pair_id, manifest.version))
            start = time.monotonic()
            try:
                workers.receive_weights(session.pair_id, manifest.layout, manifest.version, manifest.incarnation)
            except Exception as error:  # noqa: BLE001 -- see the docstring
                session.broken = f"engine workers failed to take version {manifest.version}: {error}"
                log.warning("weights: %s: %s", self.receiver_id, session.broken)
                return None
            elapsed = time.monotonic() - start
            self._link_send(msg.Applied(session.pair_id, manifest.version, True))
        return self._applied(manifest.version, elapsed)

    def _applied(self, version: int, elapsed: float) -> int:
        """Record that ``version`` is in the engine (it took ``elapsed`` seconds) and wake its waiters."""
        with self._cond:
            self._version = version
            self.last_apply_s = elapsed
            self._cond.notify_all()
        return version

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _link_send(self, message: msg.Message) -> None:
        link = self._link
        if link is not None:
            link.outbox.put(message)

    def _apply_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._link is None or self._owner.pending(),
                                    timeout=1.0)
                if self._link is None:
                    return
            try:
                self.poll()
            except Exception:
                log.exception("weights: %s: apply callback failed", self.receiver_id)

    @classmethod
    def from_config(cls, config: WeightSyncConfig, endpoint: str, receiver_id: str, apply_fn: ApplyFn,
                    **kwargs) -> WeightReceiver:
        return cls(endpoint, receiver_id, apply_fn, config=config, **kwargs)
