"""`pipeline.weights`: the learner -> rollout weight channel (`drmas.weights`), usable on its own too."""

from __future__ import annotations

from dataclasses import dataclass, fields

from drmas.config.fields import Section
from drmas.config.fields import help_field as _f

BACKENDS = ("auto", "gloo", "nccl")
FANOUTS = ("chain", "pairs")


@dataclass
class WeightSyncConfig(Section):
    """How a learner pushes new weights to the rollout processes serving its model."""

    chunk_mb: float = _f(
        32.0,
        "Size of one broadcast unit in MiB. Small tensors are packed into flat buffers of this size and larger "
        "ones are sent in slices of it. Tens of MiB keep gloo near its best rate (one 500 MB broadcast runs "
        "~8x slower); memory in flight is about two units per side.",
    )
    timeout_s: float = _f(
        30.0,
        "Deadline of every collective on a learner-rollout pair (and of building the pair and of the "
        "apply acknowledgement). A rollout that misses it is dropped from the push and must re-join.",
    )
    ready_timeout_s: float = _f(
        120.0,
        "How long a push waits for a rollout to reach a point where it can take the weights (the end of its "
        "current generation step). A rollout that does not get there in time is dropped and re-joins.",
    )
    ready_gather_s: float = _f(
        0.5,
        "Once the first rollout of a push is ready, the longest the learner waits for the others before it "
        "starts sending. Rollouts ready together share one pass down one relay chain; each later group costs "
        "the learner another pass over the whole model, while waiting pauses the ready rollouts' generation. "
        "The learner waits no longer than its last pass took (at least 50 ms), so this only caps the wait.",
    )
    join_retry_s: float = _f(
        1.0,
        "First interval between a rollout's Join attempts while no learner answers; it doubles per attempt "
        "up to 10x this value, so a restarted learner is found again quickly without flooding it.",
    )
    heartbeat_s: float = _f(
        1.0, "Interval of the rollout's heartbeats to the learner (the learner answers each one)."
    )
    peer_timeout_s: float = _f(
        10.0,
        "Silence after which either side considers the other gone: the learner drops the rollout, the "
        "rollout tears its pair down and re-joins. Must exceed heartbeat_s several times.",
    )
    backend: str = _f(
        "auto",
        "Collective backend of the pair groups: 'nccl' (GPU tensors), 'gloo' (CPU tensors) or 'auto' (nccl "
        "when CUDA and NCCL are available, else gloo). The learner decides; rollouts follow it.",
    )
    fanout: str = _f(
        "chain",
        "How a push reaches several rollouts. 'chain': the learner sends each unit once, to the first rollout, "
        "and every rollout passes it on to the next while applying it (a relay chain), so the learner's "
        "traffic does not grow with the number of rollouts. 'pairs': the learner sends the whole model to "
        "each rollout over its own pair (learner traffic x rollouts). Rollouts whose engine workers receive "
        "the weights themselves are always served over their pair.",
    )

    background: bool = _f(
        True,
        "Push from a thread of the learner, so that it goes on meanwhile with its next batch (pull, "
        "advantages, forward and backward passes) while the rollouts finish their generation step, take the "
        "weights and apply them. Its next optimizer step waits for the push, and the buffer hears of the new "
        "version only once the push is over, so rollouts are admitted for a version only when they hold it. "
        "A learner of several ranks always pushes from its own thread (its gathers are collectives).",
    )

    def problems(self, where: str) -> list[str]:
        found = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "background":
                if not isinstance(value, bool):
                    found.append(f"{where}.background: must be true or false, got {value!r}")
            elif f.name not in ("backend", "fanout") and not value > 0:
                found.append(f"{where}.{f.name}: must be > 0, got {value!r}")
        if self.backend not in BACKENDS:
            found.append(f"{where}.backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.fanout not in FANOUTS:
            found.append(f"{where}.fanout: {self.fanout!r} is not one of {', '.join(FANOUTS)}")
        if self.peer_timeout_s < 2 * self.heartbeat_s:
            found.append(f"{where}.peer_timeout_s ({self.peer_timeout_s}) must be at least twice heartbeat_s "
                         f"({self.heartbeat_s}), or healthy rollouts would be dropped")
        return found

    @property
    def chunk_bytes(self) -> int:
        return max(1, int(self.chunk_mb * (1 << 20)))
