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


def _trained(ledger: DrawLedger, model: str, draws, incarnation: str = "a") -> None:
    ledger.report(model, incarnation, DrawSet(0, draws))


def test_lost_groups_are_drawn_again_before_new_draws() -> None:
    events = []
    ledger = DrawLedger(journal=events.append)
    assert ledger.issue(4) == [0, 1, 2, 3]
    ledger.opened(1, "g1")
    ledger.lost([1], "producer gone")  # a rollout died with group 1 unfinished
    ledger.opened(2, "g2")
    ledger.completed(2, {"m": 2})  # two agents' parts
    ledger.part_dropped(2, "m", "stale")
    assert ledger.issue(1) == [1]  # lost, lowest first
    ledger.part_dropped(2, "m", "stale")  # its last part: nobody trains it
    assert ledger.issue(2) == [2, 4]
    assert ledger.counters()["redrawn"] == 2
    assert [e["event"] for e in events] == ["issue", "again", "issue", "again", "issue"]
    assert events[2]["again"] == [1] and events[1]["why"] == "producer gone"


def test_a_trained_draw_is_settled_and_a_group_without_trained_parts_is_not_drawn_again() -> None:
    ledger = DrawLedger()
    ledger.issue(3)
    for draw in range(3):
        ledger.opened(draw, f"g{draw}")
    ledger.completed(0, {"m": 1})
    ledger.delivered(0, "m")
    _trained(ledger, "m", [0])
    ledger.completed(1, {})  # only frozen agents spoke: nothing to train
    ledger.completed(2, {"m": 1, "finished": 1})
    ledger.part_dropped(2, "finished", "model_finished", needed=False)
    _trained(ledger, "m", [0, 2])
    assert ledger.is_settled(0) and ledger.is_settled(1) and ledger.is_settled(2)
    assert ledger.issue(1) == [3] and ledger.counters()["redrawn"] == 0


def test_a_replaced_learner_loses_what_it_held_and_what_it_trained_past_its_checkpoint() -> None:
    ledger = DrawLedger()
    ledger.issue(6)
    for draw in range(6):
        ledger.opened(draw, f"g{draw}")
        ledger.completed(draw, {"m": 1})
    for draw in range(5):
        ledger.delivered(draw, "m")
    _trained(ledger, "m", [0, 1, 2, 3])  # draw 4 is in its next batch, 5 still queued here
    # killed; the new process resumed from a checkpoint holding draws 0 and 1
    _trained(ledger, "m", [0, 1], incarnation="b")
    assert ledger.issue(4) == [2, 3, 4, 6]  # trained past the checkpoint, held by the dead process; then new
    assert ledger.is_out(5)  # its group is still queued here: not drawn again


def test_a_restarted_buffer_draws_again_what_the_learners_do_not_hold() -> None:
    ledger = DrawLedger()  # a new buffer process: it knows nothing yet
    assert ledger.issue(2) == [0, 1]  # handed out before any learner reported (already trained: refused later)
    _trained(ledger, "m", [0, 1, 2, 3, 5])  # the learner trained these with the dead buffer's draws
    assert ledger.is_settled(0) and not ledger.is_out(0)
    assert ledger.issue(3) == [4, 6, 7]  # the gap below its highest draw, then new ones
    assert ledger.counters()["redrawn"] == 1


def test_in_a_run_of_two_learners_draws_a_peer_trained_are_not_drawn_again() -> None:
    ledger = DrawLedger()
    ledger.issue(4)
    _trained(ledger, "m1", [0, 1, 2, 3])
    _trained(ledger, "m2", [0, 1, 2, 3])
    _trained(ledger, "m1", [0, 1], incarnation="b")  # m1 resumed behind: m2 keeps 2 and 3
    assert ledger.issue(1) == [4] and ledger.counters()["lost_to_peers"] == 2


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
        ledger.opened(0, "g")
        ledger.completed(0, {"m": 1})
        if why == "producer gone" or why == "lease expired":
            ledger.lost([0], why)
        else:
            ledger.part_dropped(0, "m", why, delivered=True)
    assert ledger.issue(1) == [0] and ledger.counters()["given_up"] == 0
    ledger.part_dropped(0, "m", "too_long", fault=True)  # after a fault the count goes on (1 of MAX_FAULTS)
    assert ledger.issue(1) == [0]
