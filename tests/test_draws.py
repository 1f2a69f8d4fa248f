"""The drawing order: draw sets, the sampler's draw -> problem map, and the buffer's ledger of draws.

The ledger is pure bookkeeping, so its rules are checked here one event at a time; the whole pipeline under
`kill -9` of each process is `tests/test_lossless_resume.py`.
"""

from __future__ import annotations

import pytest

from drmas.buffer.draws import MAX_FAULTS, DrawLedger
from drmas.core.draws import DrawSet
from drmas.tasks.base import Problem
from drmas.tasks.sampler import ProblemSampler, order_change


def test_a_draw_set_keeps_a_floor_and_the_draws_above_it() -> None:
    draws = DrawSet()
    draws.update([0, 1, 3, 5])
    assert (draws.floor, draws.extra) == (2, {3, 5})
    assert 1 in draws and 2 not in draws and 5 in draws and -1 not in draws
    assert len(draws) == 4 and list(draws) == [0, 1, 3, 5] and draws.top == 6
    assert draws.missing_below(7) == [2, 4, 6]
    draws.add(2)
    assert (draws.floor, draws.extra) == (4, {5})
    assert DrawSet.from_state(draws.state_dict()) == draws
    assert DrawSet.union([DrawSet(3), DrawSet(1, [4, 7])]) == DrawSet(3, [4, 7])
    with pytest.raises(ValueError, match="draw numbers are >= 0"):
        draws.add(-1)


def test_every_draw_maps_to_the_problem_the_colocated_order_draws() -> None:
    problems = [Problem(uid=f"p{i}", question=str(i), answer=str(i)) for i in range(5)]
    walked = ProblemSampler(problems, seed=7).next(12)  # two epochs and a bit
    sampler = ProblemSampler(problems, seed=7)
    assert [sampler.at(d).uid for d in (11, 0, 5, 3)] == [walked[d].uid for d in (11, 0, 5, 3)]
    assert sorted(p.uid for p in walked[:5]) == [p.uid for p in problems]  # an epoch visits each once
    assert [p.uid for p in walked[:5]] != [p.uid for p in walked[5:10]]  # epochs shuffle anew


def test_the_order_fingerprint_names_what_changed() -> None:
    problems = [Problem(uid=f"p{i}", question=str(i), answer=str(i)) for i in range(5)]
    saved = ProblemSampler(problems, seed=7).fingerprint()
    assert order_change(saved, ProblemSampler(problems, seed=7).fingerprint()) is None
    assert order_change(None, saved) is None  # a checkpoint older than the drawing order
    assert "trainer.seed=8" in order_change(saved, ProblemSampler(problems, seed=8).fingerprint())
    edited = [*problems[:4], Problem(uid="p4", question="4 + 0", answer="4")]  # same uids, another question
    assert "training split" in order_change(saved, ProblemSampler(edited, seed=7).fingerprint())


def _trained(ledger: DrawLedger, model: str, draws, incarnation: str = "a", agents=("a1",)) -> None:
    ledger.report(model, incarnation, {agent: DrawSet(0, draws) for agent in agents})


def _complete(ledger: DrawLedger, draw: int, agents=("a1",)) -> None:
    ledger.opened(draw, f"g{draw}")
    ledger.completed(draw, agents)


def test_lost_groups_are_drawn_again_before_new_draws() -> None:
    events = []
    ledger = DrawLedger(journal=events.append)
    assert ledger.issue(4) == [0, 1, 2, 3]
    ledger.opened(1, "g1")
    ledger.lost([1], "producer gone")  # a rollout died with group 1 unfinished
    _complete(ledger, 2, ("a1", "a2"))  # two agents' parts
    ledger.part_dropped(2, "a1", "stale")
    assert ledger.issue(1) == [1]  # lost, lowest first
    ledger.part_dropped(2, "a2", "stale")  # its last part: nobody trains it
    assert ledger.issue(2) == [2, 4]
    assert ledger.counters()["redrawn"] == 2
    assert [e["event"] for e in events] == ["issue", "again", "issue", "again", "issue"]
    assert events[2]["again"] == [1] and events[1]["why"] == "producer gone"


def test_a_draw_is_done_once_every_agent_with_a_part_trained_it() -> None:
    ledger = DrawLedger()
    ledger.issue(4)
    _complete(ledger, 0, ("a1", "a2"))
    ledger.completed(1, ())  # only frozen agents spoke: nothing to train
    _complete(ledger, 2, ("a1",))  # a2 had no part in this group
    _complete(ledger, 3, ("a1", "fin"))
    ledger.part_dropped(3, "fin", "model_finished", needed=False)  # its learner finished: not missed
    _trained(ledger, "m", [0, 2, 3], agents=("a1",))
    assert not ledger.is_settled(0) and ledger.is_settled(1) and ledger.is_settled(2) and ledger.is_settled(3)
    _trained(ledger, "m", [0], agents=("a2",))
    assert ledger.is_settled(0) and ledger.issue(1) == [4] and ledger.counters()["redrawn"] == 0


def test_a_draw_one_agent_missed_is_drawn_again_and_trains_only_that_agent() -> None:
    """After a learner restart the solver's part of a group was orphaned, the verifier's trained: the draw goes
    out again, the verifier's new part is dropped by its learner (already trained) and is not missed."""
    ledger = DrawLedger()
    ledger.issue(1)
    _complete(ledger, 0, ("solver", "verifier"))
    for agent in ("solver", "verifier"):
        ledger.delivered(0, agent, "m")
    ledger.part_dropped(0, "solver", "orphaned", "m", delivered=True)
    ledger.report("m", "a", {"solver": DrawSet(), "verifier": DrawSet(0, [0])})
    assert ledger.issue(1) == [0]
    _complete(ledger, 0, ("solver", "verifier"))
    ledger.part_dropped(0, "verifier", "already_trained", "m", delivered=True)
    assert ledger.is_out(0)  # the solver's part is on its way
    ledger.report("m", "a", {"solver": DrawSet(0, [0]), "verifier": DrawSet(0, [0])})
    assert ledger.is_settled(0) and ledger.issue(1) == [1]


def test_a_replaced_learner_loses_what_it_held_and_what_it_trained_past_its_checkpoint() -> None:
    ledger = DrawLedger()
    ledger.issue(6)
    for draw in range(6):
        _complete(ledger, draw)
    for draw in range(5):
        ledger.delivered(draw, "a1", "m")
    _trained(ledger, "m", [0, 1, 2, 3])  # draw 4 is in its next batch, 5 still queued here
    # killed; the new process resumed from a checkpoint holding draws 0 and 1
    _trained(ledger, "m", [0, 1], incarnation="b")
    assert ledger.issue(4) == [2, 3, 4, 6]  # trained past the checkpoint, held by the dead process; then new
    assert ledger.is_out(5)  # its group is still queued here: not drawn again


def test_a_restarted_buffer_draws_again_what_not_every_agent_trained() -> None:
    ledger = DrawLedger()  # a new buffer process: it knows nothing yet
    ledger.report("m", "a", {"a1": DrawSet(0, [0, 1, 2, 3, 5]), "a2": DrawSet(0, [0, 1, 2, 5])})
    assert ledger.is_settled(0) and not ledger.is_settled(3)
    assert ledger.issue(3) == [3, 4, 6]  # a2 lacks 3, nobody trained 4; then new ones
    assert ledger.counters()["redrawn"] == 2


def test_a_learner_resumed_behind_its_peer_gets_back_what_it_lost() -> None:
    """Draws are kept per agent: m1's agent resumed behind, so draws 2 and 3 go out again (m2's learner drops
    its parts of them as trained already): neither model loses a prompt, neither trains one twice."""
    ledger = DrawLedger()
    ledger.issue(4)
    for draw in range(4):
        _complete(ledger, draw, ("s", "v"))
    ledger.report("m1", "a", {"s": DrawSet(4)})
    ledger.report("m2", "x", {"v": DrawSet(4)})
    ledger.report("m1", "b", {"s": DrawSet(2)})  # m1 resumed behind
    assert ledger.issue(3) == [2, 3, 4]


def test_a_draw_lost_again_and_again_by_its_prompts_fault_is_given_up() -> None:
    events = []
    ledger = DrawLedger(journal=events.append)
    for _ in range(MAX_FAULTS):
        assert ledger.issue(1) == [0]
        ledger.lost([0], "refused", fault=True)
    assert ledger.issue(1) == [1]
    assert ledger.counters()["given_up"] == 1 and events[-2]["event"] == "give_up"
    assert DrawLedger(given_up_before=[0]).issue(1) == [1]  # a restarted buffer reads it from the journal


def test_a_draw_lost_to_crashes_and_the_staleness_bound_is_never_given_up() -> None:
    """After a resume one draw can be orphaned, then stale, then lost with a rollout: still drawn again."""
    ledger = DrawLedger()
    for why in ("orphaned", "stale", "producer gone", "stale", "lease expired"):
        assert ledger.issue(1) == [0]
        _complete(ledger, 0)
        if why in ("producer gone", "lease expired"):
            ledger.lost([0], why)
        else:
            ledger.part_dropped(0, "a1", why)
    assert ledger.issue(1) == [0] and ledger.counters()["given_up"] == 0
    ledger.part_dropped(0, "a1", "too_long", fault=True)  # after a fault the count goes on (1 of MAX_FAULTS)
    assert ledger.issue(1) == [0]
