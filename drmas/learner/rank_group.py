"""The ranks of one model's learner in the pipeline: rank 0 is the learner, the others follow it.

Only rank 0 talks to the buffer (and to the rollouts): it pulls a step's groups, computes the advantages
and the running reward statistics, and hands every other rank the same (samples, advantages) by one
broadcast; each rank then trains on its share inside `PolicyTrainer.update` (`drmas.learner.sharding`).
Why not each rank pulling its own share: the agent-wise advantages and the running statistics need whole
groups and one history per model, the buffer's admission and staleness rules follow one version per model,
and a step must have the same groups on every rank or the ranks would disagree on the global token count.
The samples are small next to the model (token ids and log-probs), so sending all of them to every rank
costs little, and every rank computes the same metrics.

The followers repeat what rank 0 does with the model in the same order, because every sharded pass and
every gather of the whole weights is a collective: the initial gather, then per step the update and the
gather of the new weights (which rank 0 pushes to the rollouts and saves). A `None` batch ends them. When
any rank fails, torchrun ends the others (a failed update is therefore not skipped as with one rank).

Interim, until the weight fan-out and distributed checkpoints (issue 14): every rank gathers the whole
weights after each update (rank 0 keeps them for pushes, joins and its checkpoint: one full copy beside
its shard), and a checkpoint of N ranks holds the weights but no optimizer state, so it does not resume.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist

from drmas.devices import check_ranks, resolve_device
from drmas.learner.ranks import SingleRank
from drmas.learner.sharding import ShardedRanks, init_ranks

log = logging.getLogger(__name__)


def learner_ranks(device_spec: str, ranks: int, model_id: str) -> tuple[SingleRank, torch.device]:
    """This process's place among the model's `ranks` learner ranks, and its device; joins the process
    group when `ranks` > 1 (started by torchrun: rank i takes GPU LOCAL_RANK, or a CPU core)."""
    key = f"models.{model_id}.ranks"
    check_ranks(device_spec, ranks, key)
    device = resolve_device(device_spec, f"models.{model_id}.device")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks == 1:
        return SingleRank(), device
    if world != ranks:
        raise ValueError(f"{key}={ranks}, but this process is one of {world} (WORLD_SIZE): start the learner as "
                         f"`torchrun --nproc-per-node {ranks} -m drmas.learner ...` (drmas run does)")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    init_ranks(device.type)
    return ShardedRanks(device), device


class BatchFanout:
    """Rank 0's (samples, advantages) to every other rank, over a gloo group of its own (objects travel on
    CPU whatever carries the model's collectives)."""

    def __init__(self, ranks: SingleRank) -> None:
        self.size = ranks.size
        self.group = dist.new_group(backend="gloo") if self.size > 1 else None

    def send(self, samples: Sequence | None, advantages: np.ndarray | None = None) -> None:
        """Rank 0: the next update's batch (None: no more updates)."""
        if self.group is not None:
            dist.broadcast_object_list([None if samples is None else (list(samples), advantages)], src=0,
                                       group=self.group)

    def finish(self) -> None:
        """Rank 0, at the end: tell the other ranks to stop; a rank that is gone already is only logged, so
        rank 0 still writes its last checkpoint."""
        try:
            self.send(None)
        except RuntimeError as exc:  # torch.distributed errors (a closed peer, a timeout) derive from it
            log.warning("could not tell the other learner ranks to stop: %s", exc)

    def receive(self):
        """Other ranks: (samples, advantages), or None when rank 0 is done."""
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def follow(trainer, fanout: BatchFanout, version: int = 0) -> int:
    """A rank other than 0: take every update rank 0 takes, then gather the new weights with it."""
    _take_part_in_gather(trainer)  # rank 0's initial gather (what joining rollouts receive)
    while (batch := fanout.receive()) is not None:
        samples, advantages = batch
        trainer.update(samples, advantages, version=version)
        version += 1
        _take_part_in_gather(trainer)
    log.info("rank %d of the %r learner done at version %d", trainer.ranks.rank, trainer.model_id, version)
    return version


def _take_part_in_gather(trainer) -> None:
    """Join rank 0's gather of the whole weights (each parameter's all-gather is a collective) keeping none
    of them: a follower needs only its shard, so it holds one whole parameter at a time, never the model."""
    for _ in trainer.named_tensors():
        pass
