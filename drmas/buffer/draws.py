"""The buffer's side of the drawing order: which draws to hand out, which are on their way, which to draw again.

Where the order lives, and why here. Every process of the pipeline may be killed with `kill -9`, so no
process may hold the only copy of what has been drawn. The *order* is a pure function of the seed
(`drmas.tasks.sampler.ProblemSampler.at`); what must survive is *which draws were trained*, and that lives
where training lives: each learner keeps the draws each of its agents has trained (`drmas.core.draws.DrawSet`)
in its checkpoint and reports them with every version (`VersionUpdate.trained`). The buffer is the one place
every group passes through, so it hands the draws out (a grant is a list of draw numbers, lowest first) and
follows each one until it is done -- every agent with a part in its group trained it -- and any draw that is
lost on the way is handed out again before a new one:

* a lease that expires, a producer that goes silent (a rollout killed), a group dropped before it completed
  (incomplete, a refused episode): the draw is drawn again;
* a part of a group dropped before training (stale, undecodable, an update that failed, orphaned weights):
  once no part of the group is on its way, the draw is drawn again unless every agent with a part in it
  trained it. Learners drop the parts of a draw their agent trained already, so a draw drawn again for one
  agent (the solver's part orphaned, the verifier's trained) trains only what is missing, and a learner
  resumed behind its peers gets back what it lost without training its peers twice;
* a learner killed: its new process reports the draws of its checkpoint. Parts delivered to the dead one, and
  draws it had trained past that checkpoint, are drawn again;
* the buffer killed: it forgets everything, and learns from the learners' reports what was trained. The draws
  below the highest trained one that not every agent trained are drawn again (rollouts drop the groups of the
  dead buffer's grants: the new one refuses their episodes), new draws continue above it. (A learner counts
  a draw as trained for its agents that had no part in the group, `AgentGroup.group_agents`, so those are
  not mistaken for missing.)

So a killed and resumed run trains the same multiset of prompts, agent by agent, as an uninterrupted one; what
the crashes cost is generation: the groups in flight are drawn again (counted: `redrawn`). A draw lost
`MAX_FAULTS` times by its prompt's fault (`fault`: an episode refused, a sample the model cannot take -- a
prompt no model can train, e.g. one longer than the model's context) is given up and counted, rather than
drawn forever; losses that say nothing about the prompt (a process killed, a lease expired, a part too stale
or of orphaned weights, which a resume causes by the handful) never give a draw up.

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
    """A draw handed out and not done yet."""

    group_id: str = ""  # once its group's first episode arrived
    parts: Counter = field(default_factory=Counter)  # agent -> parts of its group queued here or at its learner
    lost: bool = False  # a needed part was dropped before training: draw it again once no part is on its way
    fault: bool = False  # ... by the prompt's fault (see the module docstring)


class DrawLedger:
    """Draws handed out, trained (as learners report them, per agent), and lost: see the module docstring."""

    def __init__(self, journal: Optional[Callable[[dict], None]] = None, handed_out_before: int = 0,
                 given_up_before: Iterable[int] = ()) -> None:
        """`journal`: called with every event that changes which draws are out ({"event": "issue"|"again"|
        "give_up", "draws": [...], ...}); the buffer process writes them to `buffer/draws.jsonl`.
        `handed_out_before`: one past the highest draw an earlier buffer of this run handed out (read from that
        journal), so that drawing one of those again is counted and said as such; `given_up_before`: the draws
        it gave up (not drawn again by this one either)."""
        self._journal = journal
        self.handed_out_before = handed_out_before
        self.reported: dict[str, DrawSet] = {}  # agent -> the draws its learner reports it trained
        self.incarnations: dict[str, str] = {}  # model -> its learner process
        self._void = DrawSet(0, given_up_before)  # draws settled here: nothing to train in them, or given up
        self._needs: dict[int, set[str]] = {}  # draw -> the agents its groups had parts for (once complete)
        self.settled = self._void.copy()  # done (every agent concerned trained it), or void
        self.cursor = 0  # the lowest draw never handed out
        self._free: list[int] = []  # lost draws (a heap), handed out again before any new one
        self._out: dict[int, _Out] = {}
        self._by_group: dict[str, int] = {}
        self._at_learner: dict[str, Counter] = {}  # model -> (draw, agent) -> parts delivered to its current learner
        self._times: Counter = Counter()  # draw -> times handed out (while not settled)
        self._faults: Counter = Counter()  # draw -> times lost by its prompt's fault (while not settled)
        self.issued = 0
        self.redrawn = 0
        self.given_up = 0

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

    def completed(self, draw: int, agents: Iterable[str]) -> None:
        """`draw`'s group completed with a part for each of `agents` (none: nothing to train in it)."""
        out = self._out.get(draw)
        if out is None:
            return
        agents = set(agents)
        out.parts.update(agents)
        self._needs.setdefault(draw, set()).update(agents)
        if not self._needs[draw]:
            self._settle_here(draw)

    def delivered(self, draw: int, agent: str, model: str) -> None:
        if draw in self._out:
            self._at_learner.setdefault(model, Counter())[draw, agent] += 1

    def part_dropped(self, draw: int, agent: str, why: str, model: str = "", delivered: bool = False,
                     needed: bool = True, fault: bool = False) -> None:
        """`agent`'s part of `draw`'s group was dropped before training (`delivered`: by the learner of
        `model`). `needed`: the agent still trains (False: its learner finished, the part is not missed);
        `fault`: for the prompt's sake (a sample the model cannot take), not a crash's or the staleness bound's."""
        out = self._out.get(draw)
        if out is None:
            return
        at = self._at_learner.get(model) if delivered else None
        if at is not None and at[draw, agent] > 0:
            at[draw, agent] -= 1
            if not at[draw, agent]:
                del at[draw, agent]
        out.parts[agent] = max(out.parts[agent] - 1, 0)
        if not needed:
            self._needs.get(draw, set()).discard(agent)
        elif draw not in self.reported.get(agent, ()):  # a part of a draw its agent trained is not missed
            out.lost = True
            out.fault = out.fault or fault
        self._say_again(self._resolve(draw), why)

    def group_draw(self, group_id: str) -> Optional[int]:
        return self._by_group.get(group_id)

    # ---- what learners trained ------------------------------------------------------------------------

    def report(self, model: str, incarnation: str, trained: Mapping[str, DrawSet]) -> None:
        """`model`'s learner has trained `trained` (agent -> draws; a new process: those of the checkpoint it
        resumed from)."""
        previous = {agent: self.reported.get(agent) for agent in trained}
        new_process = bool(incarnation) and self.incarnations.get(model) not in (None, incarnation)
        if incarnation:
            self.incarnations[model] = incarnation
        self.reported.update(trained)
        self.cursor = max([self.cursor, *(draws.top for draws in trained.values())])  # a restarted buffer
        self._recount()
        gone = self._at_learner.pop(model, Counter()) if new_process else Counter()
        for (draw, agent), n in gone.items():
            out = self._out.get(draw)
            if out is not None:  # delivered to the dead process: gone with it
                out.parts[agent] = max(out.parts[agent] - n, 0)
                out.lost = out.lost or draw not in trained.get(agent, ())
        again = [d for draw in list(self._out) for d in self._resolve(draw)]
        with_process = {draw for draw, _ in gone}
        self._say_again([d for d in again if d in with_process],
                        f"delivered to the learner of {model} that was replaced, not trained by it")
        self._say_again([d for d in again if d not in with_process],
                        "a part of its group was dropped before training, the other agents trained theirs")
        behind = {d for agent, before in previous.items() if new_process and before is not None
                  for d in range(trained[agent].floor, before.top) if d in before and d not in trained[agent]}
        missing = self._missing()
        self._push_free(missing)
        self._say_again([d for d in missing if d in behind],
                        f"trained past the checkpoint the learner of {model} resumed from")
        self._say_again([d for d in missing if d not in behind],
                        f"handed out before this buffer started, not trained by every agent (reported by {model})")

    def _recount(self) -> None:
        """`settled` from the reports: below every agent's floor all is done (but for a group with a part for an
        agent that has not reported); above it, draw by draw."""
        if not self.reported:
            return
        floor = min(draws.floor for draws in self.reported.values())
        below = [d for d in self._needs if d < floor]
        for draw in below:
            if self._done(draw):
                del self._needs[draw]  # every agent concerned trained it: no need to remember them
        floor = min([floor, *(d for d in below if d in self._needs)])
        done = DrawSet(floor, (d for d in range(floor, self.cursor) if self._done(d)))
        self.settled = DrawSet.union([done, self._void])

    def _done(self, draw: int) -> bool:
        """Whether every agent concerned trained `draw`: those with a part in its group, or (a group this
        buffer did not see complete) every agent that reported."""
        agents = self._needs.get(draw) or self.reported.keys()
        return all(draw in self.reported.get(agent, ()) for agent in agents)

    def _missing(self) -> list[int]:
        """Draws handed out (below the cursor) that are neither done, nor on their way, nor waiting to go out
        again: what a killed process held (a learner's trained past its checkpoint, a dead buffer's grants)."""
        waiting = set(self._free)
        return [d for d in range(self.settled.floor, self.cursor)
                if d not in self.settled and d not in self._out and d not in waiting]

    def _push_free(self, draws: list[int]) -> None:
        """Draws handed out before (by this buffer or an earlier one) that must be drawn again."""
        for draw in draws:
            self._times[draw] = max(self._times[draw], 1)
            heapq.heappush(self._free, draw)

    # ---- internals ------------------------------------------------------------------------------------

    def _resolve(self, draw: int) -> list[int]:
        """Once no part of `draw` is on its way (a part whose agent trained the draw is not): forget it if it is
        done, or free it if a part was lost; returns it if freed."""
        out = self._out.get(draw)
        if out is None:
            return []
        if any(n > 0 and draw not in self.reported.get(agent, ()) for agent, n in out.parts.items()):
            return []
        if draw in self.settled or (draw in self._needs and self._done(draw)):
            self.settled.add(draw)
            self._forget(draw)
            return []
        if not out.lost:
            return []  # not complete yet
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
            for key in [k for k in at if k[0] == draw]:
                del at[key]
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
        """`issued` (draws handed out), `redrawn` (of them, draws handed out again), `given_up`, `out` (handed
        out, not done), `cursor` (the lowest draw never handed out), `trained` (settled)."""
        return {"issued": self.issued, "redrawn": self.redrawn, "given_up": self.given_up,
                "out": len(self._out), "cursor": self.cursor, "trained": len(self.settled)}


def _short(draws: list[int], limit: int = 12) -> str:
    shown = ", ".join(map(str, sorted(draws)[:limit]))
    return f"[{shown}{', ...' if len(draws) > limit else ''}] ({len(draws)})"
