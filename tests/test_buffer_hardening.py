"""The trajectory buffer under attack and under learner restarts: each test reproduces a defect that was
measured against a running buffer (issue 10) and would fail without its fix."""

from __future__ import annotations

import math

import msgspec
from buffer_harness import (  # noqa: F401  (fixtures)
    clients,
    conserved,
    episode,
    make_buffer,
    make_sample,
    replies,
    send_group,
    wait_until,
)

from drmas.buffer.admission import AdmissionController
from drmas.buffer.framing import encode_frames
from drmas.buffer.messages import (
    MESSAGE_SCHEMA_VERSION,
    DropReport,
    EpisodeMsg,
    StatsRequest,
    VersionUpdate,
    encode_message,
)

# ---- a restarted learner of two (defect 1) ---------------------------------------------------------


def _advance(admission: AdmissionController, model: str, incarnation: str, versions: range) -> None:
    for version in versions:
        admission.update_version(model, version, incarnation, queued_groups=14 - 2 * version)


def test_a_group_gives_its_budget_back_only_when_it_leaves_its_model_nothing_to_train() -> None:
    """After a learner restart the solver's part of a group was orphaned and its verifier's trained: the group
    was consumed, and refunding it let rollouts start a group too many (dropped stale, drawn again)."""
    admission = AdmissionController({"solver": "m", "verifier": "m"}, {"m": 2}, max_staleness=0,
                                    max_running=None, lease_timeout_s=60)
    admission.update_version("m", 0, "a")
    for group in ("g0", "g1"):
        admission.on_complete({"m"}, leased=False, group_id=group, parts={"m": 2})
    admission.on_dropped("g0", "m")  # the solver's part: the verifier's is trained
    assert admission.accepted["m"] == 2 and admission.capacity() == 0
    admission.on_dropped("g1", "m")
    admission.on_dropped("g1", "m")  # both parts: nothing of it is trained
    assert admission.accepted["m"] == 1 and admission.capacity() == 1
    admission.on_complete({"m"}, leased=False, group_id="g2", parts={"m": 2})
    admission.on_dropped("g2", "m", whole=True)  # a draw drawn again for one agent: not counted in a step
    assert admission.accepted["m"] == 1


def test_a_learner_restarted_behind_its_peer_gets_its_budget_back() -> None:
    admission = AdmissionController({"solver": "m1", "verifier": "m2"}, {"m1": 2, "m2": 2}, max_staleness=1,
                                    max_running=None, lease_timeout_s=60)
    for _ in range(14):  # 6 steps of 2 groups trained by both learners, 2 more groups queued
        admission.on_complete({"m1", "m2"}, leased=False)
    _advance(admission, "m1", "a", range(1, 7))
    _advance(admission, "m2", "b", range(1, 7))
    assert admission.capacity() == (1 + 6 + 1) * 2 - 14

    # m2's learner is killed and restarted without a checkpoint: version 0, by a new process; before, its
    # accepted count stayed at 14 > the 4 groups version 0 may have, and nothing was ever admitted again
    admission.update_version("m2", 0, "b-restarted", queued_groups=2)
    assert admission.accepted["m2"] == 2 and admission.capacity() == 2
    # the same process reporting again does not recount (its own pulls are still counted)
    admission.on_complete({"m1", "m2"}, leased=False)
    admission.update_version("m2", 0, "b-restarted", queued_groups=0)
    assert admission.accepted["m2"] == 3

    # m1's learner reaches its last step and stops consuming: admission follows m2 alone from now on,
    # where before m1's exhausted budget starved m2 two steps short of its end
    admission.update_version("m1", 8, "a", finished=True)
    for _ in range(6):
        admission.on_complete({"m1", "m2"}, leased=False)
    assert admission.capacity() == 0  # m2 at version 0 holds 9 groups: beyond its 4
    admission.update_version("m2", 5, "b-restarted")
    assert admission.capacity() == (1 + 5 + 1) * 2 - 10
    admission.update_version("m2", 9, "b-restarted", finished=True)
    assert admission.capacity() == 0  # everybody finished: nothing generated now could be trained


def test_parts_of_a_finished_model_are_dropped_not_held(make_buffer, clients) -> None:
    buf = make_buffer(groups_per_step={"m1": 1, "m2": 1}, max_staleness=1)
    producer, learner = clients.producer(buf), clients.consumer(buf)
    send_group(producer, "before", 2)
    producer.flush()
    wait_until(lambda: buf.stats().depth.get("verifier") == 1)
    learner.report_version("m2", 3, "learner-of-m2", finished=True)
    send_group(producer, "after", 2)
    producer.flush()
    wait_until(lambda: buf.stats().depth.get("solver") == 2)
    stats = buf.stats()
    assert stats.depth["verifier"] == 0 and stats.dropped == {"model_finished": 4} and conserved(stats)
    assert [g.group_id for g in learner.pull(["solver"], max_groups=4)] == ["before", "after"]


def test_a_new_learner_of_a_finished_model_reopens_it(make_buffer, clients) -> None:
    """A long-running buffer, a learner that finished, and a new learner of the same model (to train further):
    the new incarnation reopens the model, its groups are kept and delivered again and admission follows it."""
    buf = make_buffer(groups_per_step={"m1": 1, "m2": 1}, max_staleness=1)
    producer, learner = clients.producer(buf), clients.consumer(buf)
    learner.report_version("m1", 3, "learner-of-m1", finished=True)
    learner.report_version("m2", 3, "learner-of-m2", finished=True)
    assert producer.request_admission(4) == []  # nobody trains: nothing is admitted
    learner.report_version("m2", 3, "learner-of-m2-again")  # resumed at its last version, more steps to go
    assert producer.request_admission(4)
    send_group(producer, "after", 2, version=3)
    producer.flush()
    wait_until(lambda: buf.stats().depth.get("verifier") == 1)
    assert [g.group_id for g in learner.pull(["verifier"], max_groups=1)] == ["after"]
    assert buf.stats().dropped.get("model_finished", 0) == 2  # only m1's part: m1 is still finished


def test_a_fresh_learner_after_a_finished_one_gets_groups_or_says_why_it_waits(make_buffer, clients, caplog) -> None:
    """Issue 33: a learner of m trains and finishes; a fresh one (new output directory, version 0) starts against
    the same buffer. It is handed groups; while all it gets are groups made with the finished learner's weights
    (rollouts not re-joined yet, or a producer that never takes its weights) it drops them as orphaned, and it
    used to wait in silence: it must say why it waits and what to do."""
    import logging

    from drmas.core.draws import DrawSet
    from drmas.core.lineage import Lineage
    from drmas.learner.batch import GroupCollector
    from drmas.runtime.process import StopFlag

    buf = make_buffer(groups_per_step={"m1": 1, "m2": 1}, max_staleness=1)
    producer, first = clients.producer(buf), clients.consumer(buf)
    first.report_version("m2", 0, "learner-of-m2")
    first.report_version("m1", 1, "finished-one", trained={"solver": DrawSet(2)})
    first.report_version("m1", 1, "finished-one", finished=True, trained={"solver": DrawSet(2)})

    def send(group: str, incarnation: str, version: int) -> None:
        (draw,) = producer.request_admission(1)
        for i in range(2):
            episode_id, samples = episode(group, i, version=version)
            for sample in samples:
                sample.policy_incarnation = incarnation
            producer.send_episode(group, 2, episode_id, samples, draw=draw)
        producer.flush()

    fresh = clients.consumer(buf)
    lineage = Lineage()  # a new process of its own, no checkpoint: version 0
    fresh.report_version("m1", 0, lineage.incarnation, trained={"solver": DrawSet()})
    collector = GroupCollector(fresh, ["solver"], groups_per_step=1, max_staleness=1,
                               stop=StopFlag(install=False), poll_ms=50)
    collector.report_after_s = 0.5
    send("old-weights", "finished-one", 1)
    sent_own = []

    def own_weights_later() -> None:  # the rollouts re-joined the fresh learner: its weights from now on
        if not sent_own and any("waiting" in r.getMessage() for r in caplog.records):
            send("own-weights", lineage.incarnation, 0)
            sent_own.append(True)

    collector.idle = own_weights_later
    with caplog.at_level(logging.WARNING, logger="drmas.learner.batch"):
        batch = collector.next_batch(0, lineage)
    assert [g.group_id for g in batch.groups] == ["own-weights"] and batch.dropped == {"orphaned": 2}
    (line,) = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()][:1]
    assert "2 samples orphaned" in line and "finished-one@1 (2)" in line and lineage.incarnation in line
    assert "trainer.resume=true" in line and "peer_timeout_s" in line


# ---- poisoned samples (defect 2) -------------------------------------------------------------------


def _poisoned(field: str):
    episode_id, (sample,) = episode("poison", 1, agents=("solver",))
    if field == "reward":
        sample.reward = math.nan
    elif field == "logprob":
        sample.behaviour_logprobs = [-0.5, -math.inf]
    elif field == "token":
        sample.response_ids = [4, -5]
    elif field == "length":
        sample.prompt_ids = list(range(30))
    return episode_id, [sample]


def test_poisoned_samples_are_refused_with_their_reason_and_take_their_group_down(make_buffer, clients) -> None:
    buf = make_buffer(max_sample_tokens=16, groups_per_step={"m1": 4, "m2": 4}, max_staleness=0)
    producer, learner = clients.producer(buf), clients.consumer(buf)
    expected = {"reward": "non_finite", "logprob": "non_finite", "token": "bad_token", "length": "too_long"}
    learner.report_version("m1", 0)
    learner.report_version("m2", 0)
    for field, reason in expected.items():
        assert len(producer.request_admission(1)) == 1
        group = f"poison-{field}"
        good_id, good = episode(group, 0, agents=("solver",))
        producer.send_episode(group, 3, good_id, good)
        episode_id, samples = _poisoned(field)
        for sample in samples:
            sample.group_id, sample.episode_id = group, f"{group}/e1"
        producer.send_episode(group, 3, f"{group}/e1", samples)
        third_id, third = episode(group, 2, agents=("solver",))
        producer.send_episode(group, 3, third_id, third)
        producer.flush()
        assert [r.reason for r in producer.pop_rejections()] == [reason, "group_discarded"], field
    stats = learner.stats()
    assert stats.rejected == {"non_finite": 2, "bad_token": 1, "too_long": 1, "group_discarded": 4}
    assert stats.dropped == {"refused_episode": 4} and conserved(stats)
    assert stats.running_groups == 0  # each dropped group gave its admission slot back at once
    assert len(producer.request_admission(4)) == 4


def test_header_only_validation_still_refuses_a_non_finite_reward(make_buffer, clients) -> None:
    buf = make_buffer(validate_samples=False)
    producer = clients.producer(buf)
    producer.send_episode("poison", 1, *_poisoned("reward"))
    producer.flush()
    assert [r.reason for r in producer.pop_rejections()] == ["non_finite"]


# ---- capacity is enforced (defect 4) --------------------------------------------------------------


def _episode_msg(seq: int, group: str, group_size: int, index: int) -> list[bytes]:
    episode_id, samples = episode(group, index, agents=("solver",))
    return encode_frames(EpisodeMsg(producer="flood", seq=seq, group_id=group, group_size=group_size,
                                    episode_id=episode_id, samples=samples))


def test_a_producer_ignoring_acknowledgements_cannot_grow_the_buffer(make_buffer, clients) -> None:
    buf = make_buffer(capacity_samples=32, window=4, max_held_samples=64)
    flood = clients.raw(buf.producer_endpoint)
    for seq in range(2000):  # one new group per episode, never waiting for an ack
        flood.send_multipart(_episode_msg(seq, f"g{seq}", 1, 0))
    answers = replies(flood, 2000 - 4)  # the last window's acks stay parked: nobody drains the buffer
    refused = [r.reason for r in answers if not r.accepted]
    assert len(answers) == 2000 - 4 and set(refused) == {"flow_control"}
    stats = buf.stats()
    assert stats.samples_in_buffer == 32 + 4 and stats.parked_acks == 4 and conserved(stats)

    # episodes of a huge group once started are acknowledged at once (a started group must be able to
    # complete), so only the hard limit stops them: 64 - 36 = 28 fit, the 29th is refused and its group,
    # which can no longer complete, dropped; the first episode's ack stays parked
    other = clients.raw(buf.producer_endpoint)
    for index in range(100):
        other.send_multipart(_episode_msg(10_000 + index, "huge", 1000, index))
    answers = replies(other, 99)
    assert [r.reason for r in answers if not r.accepted] == ["buffer_full"] + ["group_discarded"] * 71
    stats = buf.stats()
    assert stats.samples_in_buffer == 36 and stats.dropped == {"refused_episode": 28} and conserved(stats)


# ---- messages that once cost a traceback or a counter (defects 6, 7) ------------------------------


def test_a_deeply_nested_message_is_malformed_not_an_internal_error(make_buffer, clients) -> None:
    buf = make_buffer()
    raw = clients.raw(buf.producer_endpoint)
    request = encode_message(StatsRequest(seq=5))
    assert request[0] == 0x83  # a msgpack map of 3 fields: add a 4th, nested deeper than any stack
    raw.send(bytes([0x84]) + request[1:] + b"\xa4junk" + b"\x91" * 200_000 + b"\x00")
    reply = replies(raw, 1)[0]
    assert (reply.accepted, reply.reason) == (False, "malformed")
    assert buf.stats().rejected == {"malformed": 1}


def test_learner_messages_cannot_blow_up_the_buffer_counters(make_buffer, clients) -> None:
    buf = make_buffer()
    learner = clients.consumer(buf)
    raw = clients.raw(buf.consumer_endpoint)
    for index in range(100):  # many distinct (well-formed) reasons: at most 32 are kept apart
        learner.report_drops("solver", [f"g{index}"], 1, f"reason_{index}")
    payloads = {
        "free text": msgspec.msgpack.encode({**msgspec.structs.asdict(DropReport(
            seq=1, agent="solver", group_ids=[], n_samples=1, reason="x")), "type": "DropReport",
            "reason": "no such thing " * 1000}),
        "version 2**63": msgspec.msgpack.encode({"type": "VersionUpdate", "schema_version": MESSAGE_SCHEMA_VERSION, "seq": 2,
                                                 "model": "m1", "version": 2**63}),
        "version 2**40": encode_message(VersionUpdate(seq=3, model="m1", version=2**40)),
    }
    for what, payload in payloads.items():
        raw.send(payload)
        reply = replies(raw, 1)[0]
        assert (reply.accepted, reply.reason) == (False, "invalid"), what
    stats = learner.stats()  # still answers: no counter became unencodable
    assert len(stats.reported_drops) == 33 and stats.reported_drops["other"] == 68
    assert stats.model_versions == {"m1": 0, "m2": 0} and stats.rejected == {"invalid": 3}
