"""The buffer's side of the drawing order: which draws to hand out, which are on their way, which to draw again.

Where the order lives, and why here. Every process of the pipeline may be killed with `kill -9`, so no
process may hold the only copy of what has been drawn. The *order* is a pure function of the seed
(`drmas.tasks.sampler.ProblemSampler.at`); what must survive is *which draws were trained*, and that lives
where training lives: each learner keeps the draws its weights have trained (`drmas.core.draws.DrawSet`) in
its checkpoint and reports them with every version (`VersionUpdate.trained`). The buffer is the one place
every group passes through, so it hands the draws out (a grant is a list of draw numbers, lowest first) and
follows each one until a learner reports it trained; any draw that is lost on the way is handed out again
before a new one:

* a lease that expires, a producer that goes silent (a rollout killed), a group dropped before it completed
  (incomplete, a refused episode): the draw is drawn again;
* a group's parts dropped before training (stale, undecodable, an update that failed, orphaned weights): once
  every part of it is gone and no learner trained it, the draw is drawn again;
* a learner killed: its new process reports the draws of its checkpoint. Parts delivered to the dead one, and
  draws it had trained past that checkpoint, are drawn again;
* the buffer killed: it forgets everything, and learns from the learners' reports what was trained. The draws
  below the highest trained one that no learner holds are drawn again (rollouts drop the groups of the dead
  buffer's grants: the new one refuses their episodes), new draws continue above it.

So a killed and resumed run trains the same multiset of prompts as an uninterrupted one; what the crashes cost
is generation: the groups in flight are drawn again (counted: `redrawn`). A draw lost `MAX_FAULTS` times by
its prompt's fault (`fault`: an episode refused, a sample the model cannot take -- a prompt no model can train,
e.g. one longer than the model's context) is given up and counted, rather than drawn forever; losses that say
nothing about the prompt (a process killed, a lease expired, a part too stale or of orphaned weights, which a
resume causes by the handful) never give a draw up. A draw counts as trained once any learner trained it: in a run of several learners, one learner
killed loses for itself the draws its peers trained past its checkpoint (`lost_to_peers`), since drawing them
again would train its peers twice.

Pure bookkeeping: no sockets, no clocks; `TrajectoryBuffer` calls it under its lock.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional

from drmas.core.draws import DrawSet

log = logging.getLogger(__name__)

MAX_FAULTS = 3  # times a draw's group is lost by its prompt's fault before the draw is given up


@dataclass
class _Out:
    """A draw handed out and not trained yet."""

    group_id: str = ""  # once its group's first episode arrived
    parts: Counter = field(default_factory=Counter)  # model -> parts of its group queued or at that model's learner
    lost: bool = False  # a part was dropped before training: draw it again once no part is left
    fault: bool = False  # ... by the prompt's fault (see the module docstring)


class DrawLedger:
    """Draws handed out, trained (as learners report them), and lost: see the module docstring."""

    def __init__(self, journal: Optional[Callable[[dict], None]] = None, handed_out_before: int = 0,
                 given_up_before: Iterable[int] = ()) -> None:
        """`journal`: called with every event that changes which draws are out ({"event": "issue"|"again"|
        "give_up", "draws": [...], ...}); the buffer process writes them to `buffer/draws.jsonl`.
        `handed_out_before`: one past the highest draw an earlier buffer of this run handed out (read from that
        journal), so that drawing one of those again is counted and said as such; `given_up_before`: the draws
        it gave up (not drawn again by this one either)."""
        self._journal = journal
        self.handed_out_before = handed_out_before
        self.reported: dict[str, DrawSet] = {}  # model -> the draws its learner reports trained
        self.incarnations: dict[str, str] = {}
        self._void = DrawSet(0, given_up_before)  # draws settled here: nothing to train in them, or given up
        self.settled = self._void.copy()  # reported by any learner, or void
        self.cursor = 0  # the lowest draw never handed out
        self._free: list[int] = []  # lost draws (a heap), handed out again before any new one
        self._out: dict[int, _Out] = {}
        self._by_group: dict[str, int] = {}
        self._at_learner: dict[str, Counter] = {}  # model -> draw -> parts delivered to its current learner
        self._times: Counter = Counter()  # draw -> times handed out (while not settled)
        self._faults: Counter = Counter()  # draw -> times lost by its prompt's fault (while not settled)
        self.issued = 0
        self.redrawn = 0
        self.given_up = 0
        self.lost_to_peers = 0

    # ---- handing out --------------------------------------------------------------------------------

    def issue(self, n: int) -> list[int]:
        """The next `n` draws: lost ones first (lowest first), then new ones."""
        draws, again = [], []
        while len(draws) < n:
            if self._free:
                draw = heapq.heappop(self._free)
            else:
                draw, self.cursor = self.cursor, self.cursor + 1
            if draw in self.settled or draw in self._out:
                continue  # settled or handed out again since it was freed
            if self._times[draw] or draw < self.handed_out_before:
                again.append(draw)
            self._times[draw] += 1
            self._out[draw] = _Out()
            draws.append(draw)
        self.issued += len(draws)
        self.redrawn += len(again)
        earlier = [d for d in again if not self._times[d] - 1 and d < self.handed_out_before]
        if earlier:
            log.info("draws %s go out again: an earlier buffer of this run handed them out, no learner trained them",
                     _short(earlier))
        if draws:
            self._record("issue", draws, again=again)
        return draws

    def is_settled(self, draw: int) -> bool:
        return draw in self.settled

    def is_out(self, draw: int) -> bool:
        return draw in self._out

    # ---- a draw's group on its way --------------------------------------------------------------------

    def opened(self, draw: int, group_id: str) -> None:
        """The first episode of `draw`'s group arrived."""
        out = self._out.get(draw)
        if out is not None:
            out.group_id = group_id
            self._by_group[group_id] = draw

    def unnumbered(self, draw: int) -> None:
        """A group without a draw number took `draw`'s lease unit: what happens to it cannot be followed."""
        self._settle_here(draw)

    def lost(self, draws: Iterable[int], why: str, fault: bool = False) -> None:
        """Draws whose groups will never complete (their lease expired, their producer vanished, their group
        was dropped unfinished; `fault`: an episode of it was refused): drawn again."""
        again = []
        for draw in draws:
            out = self._out.get(draw)
            if draw < 0 or out is None or draw in self.settled:
                continue
            out.lost, out.fault = True, out.fault or fault
            out.parts.clear()
            again += self._resolve(draw)
        self._say_again(again, why)

    def completed(self, draw: int, parts: Mapping[str, int]) -> None:
        """`draw`'s group completed with `parts` (model -> its agents' parts); none: nothing to train in it."""
        out = self._out.get(draw)
        if out is None:
            return
        out.parts.update({model: n for model, n in parts.items() if n})
        if not out.parts:
            self._settle_here(draw)

    def delivered(self, draw: int, model: str) -> None:
        if draw in self._out:
            self._at_learner.setdefault(model, Counter())[draw] += 1

    def part_dropped(self, draw: int, model: str, why: str, delivered: bool = False, needed: bool = True,
                     fault: bool = False) -> None:
        """One of `model`'s parts of `draw`'s group was dropped before training (`delivered`: by its learner).
        `needed`: the model still trains (False: it finished, the part is not missed); `fault`: for the prompt's
        sake (a sample the model cannot take), not a crash's or the staleness bound's."""
        out = self._out.get(draw)
        if out is None:
            return
        if delivered:
            at = self._at_learner.get(model)
            if at is not None and at[draw] > 0:
                at[draw] -= 1
                if not at[draw]:
                    del at[draw]
        out.parts[model] = max(out.parts[model] - 1, 0)
        out.lost = out.lost or needed
        out.fault = out.fault or (needed and fault)
        self._say_again(self._resolve(draw), why)

    def group_draw(self, group_id: str) -> Optional[int]:
        return self._by_group.get(group_id)

    # ---- what learners trained ------------------------------------------------------------------------

    def report(self, model: str, incarnation: str, trained: DrawSet) -> None:
        """`model`'s learner has trained `trained` (a new process: those of the checkpoint it resumed from)."""
        previous = self.reported.get(model)
        new_process = bool(incarnation) and self.incarnations.get(model) not in (None, incarnation)
        if incarnation:
            self.incarnations[model] = incarnation
        lost_with_process = self._at_learner.pop(model, Counter()) if new_process else Counter()
        self.reported[model] = trained
        self.settled = DrawSet.union([*self.reported.values(), self._void])
        for draw in [d for d in self._out if d in self.settled]:
            self._forget(draw)
        again: list[int] = []
        for draw, n in lost_with_process.items():
            out = self._out.get(draw)
            if out is not None:
                out.parts[model] = max(out.parts[model] - n, 0)
                out.lost = True
                again += self._resolve(draw)
        self._say_again(again, f"delivered to the learner of {model} that was replaced, not trained by it")
        if new_process and previous is not None:
            self._unsettled(model, previous, trained)
        if trained.top > self.cursor:  # a buffer that restarted: what earlier grants left undone below it
            gaps = [d for d in range(self.cursor, trained.top) if d not in self.settled]
            self.cursor = trained.top
            self._push_free(gaps)
            if gaps:
                self._say_again(gaps, f"handed out before this buffer started, not trained by the learner of {model}")

    def _unsettled(self, model: str, previous: DrawSet, trained: DrawSet) -> None:
        """A learner resumed from a checkpoint behind its last report: what it trained past that checkpoint is
        drawn again, unless a peer learner trained it too (then this model loses it, counted)."""
        behind = [d for d in range(trained.floor, previous.top) if d in previous and d not in trained]
        again = [d for d in behind if d not in self.settled]
        self._push_free(again)
        self._say_again(again, f"trained past the checkpoint the learner of {model} resumed from")
        kept = len(behind) - len(again)
        if kept:
            self.lost_to_peers += kept
            log.warning("draws: %d draw(s) the learner of %s trained past its checkpoint were trained by other "
                        "learners too; they are not drawn again (it loses them)", kept, model)

    def _push_free(self, draws: list[int]) -> None:
        """Draws handed out before (by this buffer or an earlier one) that must be drawn again."""
        for draw in draws:
            self._times[draw] = max(self._times[draw], 1)
            heapq.heappush(self._free, draw)

    # ---- internals ------------------------------------------------------------------------------------

    def _resolve(self, draw: int) -> list[int]:
        """Once no part of `draw` is left: forget it (trained, or nothing missed) or free it; returns it if freed."""
        out = self._out.get(draw)
        if out is None or sum(out.parts.values()) > 0:
            return []
        if draw in self.settled:
            self._forget(draw)
            return []
        if not out.lost:
            self._settle_here(draw)
            return []
        self._forget(draw, keep_count=True)
        self._faults[draw] += out.fault
        if self._faults[draw] >= MAX_FAULTS:
            self._settle_here(draw)
            self.given_up += 1
            log.warning("draws: the group of draw %d was refused or could not be trained %d times: given up (a prompt "
                        "no model can train?)", draw, MAX_FAULTS)
            self._record("give_up", [draw])
            return []
        heapq.heappush(self._free, draw)
        return [draw]

    def _settle_here(self, draw: int) -> None:
        self._void.add(draw)
        self.settled.add(draw)
        self._forget(draw)

    def _forget(self, draw: int, keep_count: bool = False) -> None:
        out = self._out.pop(draw, None)
        if out is not None and out.group_id:
            self._by_group.pop(out.group_id, None)
        for at in self._at_learner.values():
            at.pop(draw, None)
        if not keep_count:
            self._times.pop(draw, None)
            self._faults.pop(draw, None)

    def _say_again(self, draws: list[int], why: str) -> None:
        if draws:
            log.info("draws %s go back to be drawn again: %s", _short(draws), why)
            self._record("again", draws, why=why)

    def _record(self, event: str, draws: list[int], **extra) -> None:
        if self._journal is not None:
            self._journal({"event": event, "draws": list(draws), **extra})

    def counters(self) -> dict[str, int]:
        """`issued` (draws handed out), `redrawn` (of them, draws handed out again), `given_up`, `lost_to_peers`,
        `out` (handed out, not trained), `cursor` (the lowest draw never handed out), `trained` (settled)."""
        return {"issued": self.issued, "redrawn": self.redrawn, "given_up": self.given_up,
                "lost_to_peers": self.lost_to_peers, "out": len(self._out), "cursor": self.cursor,
                "trained": len(self.settled)}


def _short(draws: list[int], limit: int = 12) -> str:
    shown = ", ".join(map(str, sorted(draws)[:limit]))
    return f"[{shown}{', ...' if len(draws) > limit else ''}] ({len(draws)})"
