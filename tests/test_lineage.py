"""Which (incarnation, version) stamps a learner trains on after being killed and resumed, maybe twice."""

from __future__ import annotations

from drmas.core.lineage import Lineage


def test_a_fresh_learner_owns_its_versions_and_the_initial_weights_only():
    first = Lineage()
    assert first.contains(first.incarnation, 12) and first.contains("", 0)
    assert not first.contains("someone-else", 0)
    assert Lineage().incarnation != first.incarnation  # every process gets its own


def test_after_a_resume_the_lost_versions_of_the_killed_learner_are_orphans():
    killed = Lineage("x")  # published up to version 7, checkpointed at 5, then killed
    resumed = Lineage("y").resumed(killed.state_dict(), version=5)
    assert resumed.incarnation == "y" and resumed.ancestors == {"x": 5}
    assert all(resumed.contains("x", v) for v in range(6))  # same weights as the resumed learner's 0..5
    assert not resumed.contains("x", 6) and not resumed.contains("x", 7)  # weights that no longer exist
    assert resumed.contains("y", 6)  # its own version 6: other weights under the same number


def test_a_second_resume_keeps_the_first_ancestor_and_forgets_a_branch_that_never_saved():
    y = Lineage("y").resumed(Lineage("x").state_dict(), version=5)
    z = Lineage("z").resumed(y.state_dict(), version=9)  # y checkpointed at 9 and was killed
    assert z.ancestors == {"x": 5, "y": 9}
    assert z.contains("x", 5) and not z.contains("x", 6) and z.contains("y", 9) and not z.contains("y", 10)
    # w resumed from y's checkpoint too but died before saving anything: z never heard of it
    assert not z.contains("w", 9)


def test_a_checkpoint_without_a_lineage_keeps_only_the_new_incarnation():
    resumed = Lineage("y").resumed(None, version=3)
    assert resumed.ancestors == {} and resumed.contains("y", 4) and not resumed.contains("x", 1)
    state = resumed.state_dict()
    assert Lineage("z").resumed(state, 4).ancestors == {"y": 4}
