"""The ranks of one model's learner in the pipeline: rank 0 is the learner, the others follow it.

Only rank 0 talks to the buffer (and to the rollouts): it pulls a step's groups, computes the advantages
and the running reward statistics, and hands every other rank the same (samples, advantages) by one
broadcast; each rank then trains on its share inside `PolicyTrainer.update` (`drmas.learner.ranks.sharding`).
Why not each rank pulling its own share: the agent-wise advantages and the running statistics need whole
groups and one history per model, the buffer's admission and staleness rules follow one version per model,
and a step must have the same groups on every rank or the ranks would disagree on the global token count.
The samples are small next to the model (token ids and log-probs), so sending all of them to every rank
costs little, and every rank computes the same metrics.

The followers repeat what rank 0 does with the model in the same order, because every sharded pass, every
gather of the whole weights and every checkpoint save or load is a collective: rank 0's orders, one
broadcast each: `update` (the update), `gather` (one streamed pass over the whole weights: a push, a join
sync, a resend within a push, or the HF directory of a checkpoint; see `drmas.learner.ranks.gathered`), `save`
(every rank writes its shards of the checkpoint; rank 0's HF directory follows as a `gather`), `resume`
(every rank reads its shards). A `None` order ends them. A gather is ordered by the pass that needs it,
not implied by an update, because how many passes a step takes depends on the rollouts (none connected:
none; a broken relay chain: a second one).

A failed update cannot be skipped as with one rank: the other ranks are inside its collectives. The rank
that failed records why in the process group's store (`report_failure`) before it exits; its peers'
collectives then fail (gloo sees the closed connection; torchrun also ends the group), and rank 0 ends
the learner with a message naming every rank that reported and why (`failure_reports`), instead of a
bare collective error or a hang.

No rank keeps the whole weights: rank 0 gathers them one parameter at a time as each pass reads them
(packed into the push's units, or written into the HF checkpoint), the others take part and keep none.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist

from drmas.learner.ranks.sharding import COLLECTIVE_TIMEOUT_S, ShardedRanks, init_ranks
from drmas.learner.ranks.single import SingleRank
from drmas.models import checkpoint
from drmas.models.devices import check_ranks, resolve_device

log = logging.getLogger(__name__)


def learner_ranks(device_spec: str, ranks: int, model_id: str,
                  timeout_s: float = COLLECTIVE_TIMEOUT_S) -> tuple[SingleRank, torch.device]:
    """This process's place among the model's `ranks` learner ranks, and its device; joins the process
    group when `ranks` > 1 (started by torchrun: rank i takes GPU LOCAL_RANK, or a CPU core)."""
    key = f"models.{model_id}.ranks"
    check_ranks(device_spec, ranks, key)
    device = resolve_device(device_spec, f"models.{model_id}.device")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks == 1:
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # what else uses the current device (NCCL pairs, kernels) uses this one
        return SingleRank(), device
    if world != ranks:
        raise ValueError(f"{key}={ranks}, but this process is one of {world} (WORLD_SIZE): start the learner as "
                         f"`torchrun --nproc-per-node {ranks} -m drmas.learner ...` (drmas run does)")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    init_ranks(device.type, timeout_s)
    return ShardedRanks(device), device


ORDER_TIMEOUT_S = 600.0  # the other ranks' wait for rank 0's next order, kept alive by `keepalive` orders
KEEPALIVE_S = 60.0


class BatchFanout:
    """Rank 0's orders to every other rank (see the module docstring), over a gloo group of its own
    (objects travel on CPU whatever carries the model's collectives). With one rank every order is a no-op."""

    def __init__(self, ranks: SingleRank, timeout_s: float = ORDER_TIMEOUT_S, keepalive_s: float = KEEPALIVE_S) -> None:
        if keepalive_s >= timeout_s:
            raise ValueError(f"keepalive_s={keepalive_s} must be below timeout_s={timeout_s}")
        self.size = ranks.size
        self.keepalive_s = keepalive_s
        self.group = (dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
                      if self.size > 1 else None)
        self.last_order = time.monotonic()

    def _order(self, order: tuple | None) -> None:
        if self.group is not None:
            dist.broadcast_object_list([order], src=0, group=self.group)
            self.last_order = time.monotonic()

    def keepalive(self) -> None:
        """Rank 0, while it waits (for a batch): an `idle` order when none went out for `keepalive_s`. The
        other ranks wait for orders inside a broadcast, which fails after the group's timeout; without this
        a learner whose rollouts took long (a first vLLM start of a large model, every rollout lost) ended
        after ORDER_TIMEOUT_S of waiting."""
        if self.group is not None and time.monotonic() - self.last_order >= self.keepalive_s:
            self._order(("idle",))

    def send(self, samples: Sequence, advantages: np.ndarray) -> None:
        """Rank 0: the next update's batch."""
        self._order(("update", list(samples), advantages))

    def gather(self) -> None:
        """Rank 0, as a pass over the whole weights opens: the other ranks take part in its gathers."""
        self._order(("gather",))

    def save(self, trainer, output_dir: Path, version: int, source, tokenizer, run_state: dict,
             keep: int = 0) -> Path:
        """Rank 0: write the checkpoint of `version` with every rank: each its shards of the trainer state,
        rank 0 also the HF directory of the whole weights streamed from `source` (rank 0's weight source,
        whose pass orders the other ranks' gathers), `run_state` and the marker; then it deletes what
        `keep` leaves out (`checkpoint.prune_checkpoints`)."""
        self._order(("save", str(output_dir), version))
        model = trainer.saveable(source, tokenizer)
        return checkpoint.save_checkpoint(output_dir, version, {trainer.model_id: (model, tokenizer)},
                                          {trainer.model_id: trainer.state_dict()}, run_state, keep=keep)

    def resume(self, trainer, ckpt: Path, version: int) -> None:
        """Rank 0: load checkpoint `ckpt` (of `version`) with every rank, each into its shards."""
        self._order(("resume", str(ckpt), version))
        checkpoint.load_trainer(ckpt, trainer.model_id, trainer)

    def finish(self) -> None:
        """Rank 0, at the end: tell the other ranks to stop; a rank that is gone already is only logged."""
        try:
            self._order(None)
        except RuntimeError as exc:  # torch.distributed errors (a closed peer, a timeout) derive from it
            log.warning("could not tell the other learner ranks to stop: %s", exc)

    def receive(self) -> tuple | None:
        """Other ranks: the next order, or None when rank 0 is done."""
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def follow(trainer, fanout: BatchFanout, version: int = 0) -> int:
    """A rank other than 0: carry out rank 0's orders (updates, gathers, checkpoint saves and loads) with
    it; a failure is reported to rank 0 (`report_failure`) before it ends this rank."""
    rank = trainer.ranks.rank
    source = trainer.weight_source()  # no before_pass: rank 0 orders each pass
    try:
        while (order := fanout.receive()) is not None:
            kind, *args = order
            if kind == "update":
                samples, advantages = args
                trainer.update(samples, advantages, version=version)
                version += 1
            elif kind == "gather":
                source.follow_pass()
            elif kind == "idle":  # rank 0 still waits for a batch (BatchFanout.keepalive)
                pass
            elif kind == "save":
                checkpoint.save_checkpoint(args[0], args[1], {}, {trainer.model_id: trainer.state_dict()}, {})
            elif kind == "resume":
                checkpoint.load_trainer(Path(args[0]), trainer.model_id, trainer)
                version = args[1]
            else:
                raise ValueError(f"unknown order {kind!r} from rank 0")
    except Exception as exc:
        report_failure(rank, exc)
        raise
    log.info("rank %d of the %r learner done at version %d", rank, trainer.model_id, version)
    return version


_FAILED_KEY = "drmas/learner/failed/{rank}"
REPORT_WAIT_S = 5.0  # how long rank 0 waits for the reports of the ranks whose failure broke its collective


def report_failure(rank: int, exc: BaseException) -> None:
    """Record in the process group's store why this rank fails (rank 0 names it in its error); best effort."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(_FAILED_KEY.format(rank=rank), f"{type(exc).__name__}: {exc}"[:2000])
    except RuntimeError as store_exc:  # the store may be gone with rank 0; the traceback still goes to the log
        log.warning("rank %d could not report its failure to rank 0: %s", rank, store_exc)
    log.error("learner rank %d failed: %r", rank, exc)


def failure_reports(size: int, wait_s: float = REPORT_WAIT_S) -> dict[int, str]:
    """Rank 0: the failures other ranks reported, by rank; waits up to `wait_s` for the first report (the
    rank that broke a collective may still be writing it)."""
    store = dist.distributed_c10d._get_default_store()
    keys = {rank: _FAILED_KEY.format(rank=rank) for rank in range(1, size)}
    deadline = time.monotonic() + wait_s
    while True:
        found = {rank: store.get(key).decode() for rank, key in keys.items() if store.check([key])}
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
