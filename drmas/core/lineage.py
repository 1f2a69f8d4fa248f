"""Which weights a learner's history contains, when version numbers alone are ambiguous.

A learner that is killed and resumed from its last checkpoint numbers its versions again from there: the
killed learner may already have published versions beyond that checkpoint, and rollouts may have
generated with them. Those weights are lost, yet their samples carry version numbers the resumed learner
is about to reuse, so by number they would pass for on-policy data of weights they never came from.

Every published version is therefore stamped with the *incarnation* of the learner that made it (a random
id per learner process), and a sample names its weights by the pair (incarnation, version). A learner
keeps, across its checkpoints, the ancestors it descends from and the last version of each it kept: a
sample belongs to its history if it comes from itself, or from an ancestor at or before the version where
this learner took over. Anything else is an orphan from a lost branch and is not trained on.

Pure bookkeeping: no sockets, no clocks. The learner applies it to what it pulls.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Optional


def new_incarnation() -> str:
    """A fresh id for a learner process: random, so two lifetimes never share one."""
    return uuid.uuid4().hex[:12]


@dataclass
class Lineage:
    """The learner incarnation publishing now, and the ancestors whose versions up to a point it kept."""

    incarnation: str = field(default_factory=new_incarnation)
    ancestors: dict[str, int] = field(default_factory=dict)  # incarnation -> last version this history kept

    def contains(self, incarnation: str, version: int) -> bool:
        """Whether weights stamped (incarnation, version) are ones this learner's history published.

        '' (the initial weights, which every history shares, or a producer that stamps none) belongs.
        """
        if not incarnation or incarnation == self.incarnation:
            return True
        kept = self.ancestors.get(incarnation)
        return kept is not None and version <= kept

    def resumed(self, saved: Optional[dict[str, Any]], version: int) -> "Lineage":
        """This process's lineage after resuming, at `version`, from a checkpoint whose lineage was `saved`.

        The checkpoint's learner becomes an ancestor up to `version`; its own ancestors stay. A checkpoint
        without a lineage (written before lineages existed) gives none: its versions then count as orphans,
        which only ever drops data, never trains on the wrong weights.
        """
        ancestors: dict[str, int] = {}
        if saved:
            ancestors.update({str(k): int(v) for k, v in saved.get("ancestors", {}).items()})
            ancestors[str(saved["incarnation"])] = int(version)
        return Lineage(self.incarnation, ancestors)

    def state_dict(self) -> dict[str, Any]:
        return {"incarnation": self.incarnation, "ancestors": dict(self.ancestors)}
