"""The trajectory buffer's wire messages: msgspec Structs in one tagged union, plus validating codecs.

Every message is a msgpack map whose ``type`` field names its class (msgspec ``tag=True``) and whose
``schema_version`` is `MESSAGE_SCHEMA_VERSION`; a receiver rejects any other version instead of
guessing. Samples inside keep their own `drmas.core.sample.SCHEMA_VERSION`.

Requests carry a ``seq`` chosen by the sender and every reply echoes it, so a client can match a late
reply to the request it answers (a pull that timed out on the client side is not silently lost). The
one exception is `Acks`, the buffer's acknowledgement of every episode it stored in one round of its loop.

The two messages that carry samples (`EpisodeMsg`, `GroupBatch`) travel as several ZeroMQ frames: a
head (`EpisodeHead`, `GroupBatchHead`) and then each sample in a frame of its own, so the buffer forwards
the frames it received without re-encoding or copying them (`drmas.buffer.framing`). Every other message
is one frame (`encode_message`).
"""

from __future__ import annotations

from typing import Annotated, Callable, Optional, Union

import msgspec

from drmas.core.packed import decoder, encoder
from drmas.core.sample import SCHEMA_VERSION as SAMPLE_SCHEMA_VERSION
from drmas.core.sample import Finite, Name, Sample, Version, check_sample, reason_of

# 2: samples carry packed arrays (sample schema 2); 3: samples travel in frames of their own, and the
# buffer acknowledges episodes in batches (`Acks`); 4: groups carry their draw number (grants hand draws out,
# learners report the draws they trained: `drmas.core.draws`)
MESSAGE_SCHEMA_VERSION = 4

# Reasons a message is refused (keys of `Stats.rejected`, `Ack.reason`).
REJECT_OVERSIZED = "oversized"
REJECT_MALFORMED = "malformed"
REJECT_SCHEMA_VERSION = "schema_version"
REJECT_UNEXPECTED = "unexpected_message"
REJECT_INVALID = "invalid"
REJECT_FRAMING = "bad_framing"

# Reasons a learner drops a delivered part (`DropReport.reason`) that say nothing about its prompt: a crash's or
# the staleness bound's doing. The buffer draws such a part's draw again without counting it against the prompt
# (`drmas.buffer.draws`); any other reason (a sample the model cannot take, a failed update) counts.
DROP_STALE = "stale"
DROP_ORPHANED = "orphaned"  # made by weights a killed learner trained past the checkpoint its successor resumed
DROP_ALREADY_TRAINED = "already_trained"
CIRCUMSTANTIAL_DROPS = frozenset({DROP_STALE, DROP_ORPHANED, DROP_ALREADY_TRAINED})


# Bounds on what a client may claim. Every counter the buffer keeps is derived from these fields, so they
# are bounded where they are decoded: a version of 2**63 once made every later stats reply unencodable.
_LIMIT = 1 << 16
Seq = Annotated[int, msgspec.Meta(ge=-1, le=2**62)]
Count = Annotated[int, msgspec.Meta(ge=0, le=_LIMIT)]  # groups asked for, group sizes
Producer = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
AgentName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# A drop reason becomes a metric name (`buffer/learner_dropped/<reason>`): a short code, not free text.
DropReason = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_]{1,48}$")]
WaitMs = Annotated[int, msgspec.Meta(ge=0, le=3_600_000)]
# A group's place in the run's drawing order (`drmas.core.draws`); -1: a group outside it (no admission).
Draw = Annotated[int, msgspec.Meta(ge=-1, lt=2**31)]
PromptId = Annotated[str, msgspec.Meta(max_length=256)]  # the drawn problem's uid, for the learner's records
FrozenRewards = Annotated[list[Finite], msgspec.Meta(max_length=_LIMIT)]
# The byte size of every sample of a message, in order (see `drmas.buffer.framing` for how they are framed).
SampleSizes = Annotated[list[Annotated[int, msgspec.Meta(ge=1, lt=2**31)]], msgspec.Meta(max_length=_LIMIT)]


class MessageError(ValueError):
    """A message that must be refused; `reason` is a stable code for counting, `detail` is for humans."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class _Message(msgspec.Struct, kw_only=True, tag=True, tag_field="type"):
    """Base of every wire message: the ``type`` tag and the schema version travel in each one."""

    schema_version: int = MESSAGE_SCHEMA_VERSION


# ---- producer -> buffer -------------------------------------------------------------------------


class EpisodeMsg(_Message):
    """One finished episode: every agent call it made. The buffer assembles GRPO groups from these."""

    producer: Producer  # stable name of the rollout process (admission leases are keyed by it)
    seq: Seq  # producer-chosen sequence number, echoed by the `Ack`
    group_id: Name
    group_size: Count  # episodes the group will have; the group is complete when all arrived
    episode_id: Name
    samples: list[Sample]  # the calls of trained agents; none when only frozen agents spoke
    # rewards of the episode's calls not sent (agents no learner trains): they count in the trajectory score
    # and in the group's pooled rewards as in the colocated loop, which trains on the same episodes
    frozen_rewards: FrozenRewards = []
    draw: Draw = -1  # the draw the buffer granted for this group (every episode of the group carries it)
    prompt: PromptId = ""


class AdmitRequest(_Message):
    """Ask to start `n_groups` new groups; the grant respects every model's staleness bound."""

    seq: Seq
    producer: Producer
    n_groups: Count


# ---- learner -> buffer --------------------------------------------------------------------------


class Pull(_Message):
    """Ask for up to `max_groups` complete agent groups of `agents`, waiting up to `wait_ms` for one."""

    seq: Seq
    agents: Annotated[list[AgentName], msgspec.Meta(max_length=1024)]
    max_groups: Count = 1
    wait_ms: WaitMs = 0


class Draws(msgspec.Struct, kw_only=True):
    """A `drmas.core.draws.DrawSet` on the wire: every draw below `floor`, and `extra` above it."""

    floor: Annotated[int, msgspec.Meta(ge=0, lt=2**31)] = 0
    extra: Annotated[list[Annotated[int, msgspec.Meta(ge=0, lt=2**31)]], msgspec.Meta(max_length=_LIMIT)] = []


class VersionUpdate(_Message):
    """A learner published `version` of `model`; admission and the stale-drop rule follow it.

    `incarnation` names the learner process: a new one (a restart, possibly from an older checkpoint) makes
    the buffer recount the model's staleness budget from what it still holds, since whatever the old process
    had pulled but not trained is gone. `finished` says the learner reached its last step: admission stops
    waiting for it, and parts for its agents are no longer kept (nobody will pull them). `trained`: the draws
    each of its agents has trained (a resumed learner: those of its checkpoint); the buffer draws again what was
    handed out and is neither trained nor on its way (`drmas.buffer.draws`). None: a learner outside the
    drawing order (tests, tools).
    """

    seq: Seq
    model: Name
    version: Version
    incarnation: Name = ""
    finished: bool = False
    trained: Optional[Annotated[dict[AgentName, Draws], msgspec.Meta(max_length=1024)]] = None  # agent -> its draws


class DropReport(_Message):
    """A learner dropped delivered groups (e.g. too stale by the time it trained): count and refill."""

    seq: Seq
    agent: AgentName
    group_ids: Annotated[list[Name], msgspec.Meta(max_length=_LIMIT)]
    n_samples: Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
    reason: DropReason


class StatsRequest(_Message):
    """Ask for a `Stats` snapshot (allowed from producers and learners)."""

    seq: Seq


class AbandonGroup(_Message):
    """A producer gives up on a group it admitted: one of its episodes will never finish (an agent program
    never reported it). The buffer drops what arrived of the group (counted under `abandoned_group`), refuses
    the rest of it, and returns its admission slot now rather than after `incomplete_timeout_s`, its draw to be
    drawn again (`drmas.buffer.draws`). Never answered."""

    seq: Seq
    producer: Producer
    group_id: Name
    draw: Draw = -1  # the group's draw (returned with its lease when nothing of the group arrived)


class Heartbeat(_Message):
    """A producer is alive (sent by its heartbeat thread; never answered). A producer silent for
    `producer_timeout_s` is taken for dead: its admitted groups and unfinished groups are released."""

    seq: Seq
    producer: Producer


# ---- buffer -> clients --------------------------------------------------------------------------


class Ack(_Message):
    """Answer to a request without a richer reply, and the refusal of any request (an `EpisodeMsg` refused
    included; stored ones are acknowledged by `Acks`); ``seq=-1`` if undecodable."""

    seq: int
    accepted: bool
    reason: str = ""
    detail: str = ""
    instance: str = ""  # the answering buffer process (a new value means it restarted and lost state)


class Acks(_Message):
    """The episodes (by ``seq``) the buffer stored from one producer in one round of its loop: one message for
    many episodes instead of one each. Refusals still come one by one, as `Ack` with ``accepted=False``."""

    seqs: list[int]
    instance: str = ""  # the answering buffer process (a new value means it restarted and lost state)


class AdmitReply(_Message):
    """How many groups the producer may start now (`draws`: the draw of each), and the model versions the
    grant was based on."""

    seq: int
    granted: int
    draws: list[int] = []
    versions: dict[str, int] = {}
    instance: str = ""  # the answering buffer process (a new value means it restarted and lost state)


class AgentGroup(msgspec.Struct, kw_only=True):
    """One agent's samples within one complete GRPO group (never split across deliveries).

    `episode_scores` maps every episode of the group to its trajectory score (mean reward of all its
    calls, all agents, frozen ones included), and `group_rewards` holds the reward of every call of the
    group (empty from an older buffer), so a learner can compute `global` GRPO and `step_global`
    advantages over the whole group as well as per-agent ones.
    """

    group_id: str
    agent: str
    model: str
    samples: list[Sample]
    episode_scores: dict[str, float]
    group_rewards: list[float] = []
    draw: int = -1  # the group's draw number, and its problem's uid (see `EpisodeMsg`)
    prompt: str = ""
    # the agents with a part of the group (the others had nothing to train in it)
    group_agents: Annotated[list[AgentName], msgspec.Meta(max_length=1024)] = []


class GroupBatch(_Message):
    """Answer to a `Pull`: zero or more agent groups, oldest first."""

    seq: int
    groups: list[AgentGroup]
    instance: str = ""  # the answering buffer process (a new value means it restarted and lost state)


class Stats(_Message):
    """A snapshot of the buffer's counters. Sample counts satisfy the conservation law
    ``received_samples == delivered_samples + sum(dropped.values()) + samples_in_buffer``."""

    seq: int
    capacity_samples: int = 0
    samples_in_buffer: int = 0  # complete (queued) and incomplete groups together
    depth: dict[str, int] = {}  # agent -> complete agent groups queued
    incomplete_groups: int = 0
    parked_acks: int = 0
    parked_pulls: int = 0
    received_episodes: int = 0
    received_samples: int = 0
    delivered_groups: int = 0
    delivered_samples: int = 0
    dropped: dict[str, int] = {}  # reason -> samples discarded after being accepted
    dropped_groups: dict[str, int] = {}  # reason -> groups (agent groups, or whole incomplete groups)
    rejected: dict[str, int] = {}  # reason -> messages refused
    reported_drops: dict[str, int] = {}  # reason -> samples learners dropped after delivery
    model_versions: dict[str, int] = {}
    accepted_groups: dict[str, int] = {}  # model -> groups counted against its staleness budget
    running_groups: int = 0  # admitted (leased) groups not complete yet
    granted_groups: int = 0
    expired_lease_groups: int = 0
    draws: dict[str, int] = {}  # the drawing order's counters (`drmas.buffer.draws.DrawLedger.counters`)
    instance: str = ""  # the answering buffer process (a new value means it restarted and lost state)


Message = Union[
    EpisodeMsg, AdmitRequest, Pull, VersionUpdate, DropReport, StatsRequest, Heartbeat, AbandonGroup, Ack, Acks,
    AdmitReply, GroupBatch, Stats,
]

# ---- heads: what the first frame of a message carries ----------------------------------------------


class EpisodeHead(_Message, tag="EpisodeMsg"):
    """The first frame of an `EpisodeMsg`: everything but the samples, which follow in frames of their own."""

    producer: Producer
    seq: Seq
    group_id: Name
    group_size: Count
    episode_id: Name
    sample_sizes: SampleSizes
    frozen_rewards: FrozenRewards = []
    draw: Draw = -1
    prompt: PromptId = ""


class GroupHead(msgspec.Struct, kw_only=True):
    """An `AgentGroup` in a batch's first frame; its samples follow in the batch's sample frames, in order."""

    group_id: str
    agent: str
    model: str
    sample_sizes: SampleSizes
    episode_scores: dict[str, float]
    group_rewards: list[float] = []
    draw: int = -1
    prompt: str = ""
    group_agents: Annotated[list[AgentName], msgspec.Meta(max_length=1024)] = []


class GroupBatchHead(_Message, tag="GroupBatch"):
    """The first frame of a `GroupBatch`. `checked`: the buffer decoded and checked every sample in full
    (`validate_samples`), so the learner may skip the value checks of `drmas.core.sample.check_sample` (it
    still decodes every sample: bytes that do not decode cost their group)."""

    seq: int
    groups: list[GroupHead]
    instance: str = ""
    checked: bool = False


class SampleHeader(msgspec.Struct, kw_only=True):
    """The routing fields of a `Sample`; decoding only these skips the token lists (fast path)."""

    schema_version: int
    episode_id: Name
    group_id: Name
    agent: Name
    model: Name
    policy_version: Version
    reward: Finite = 0.0
    episode_reward: Finite = 0.0


# What a first frame may be, per receiver.
Head = Union[
    EpisodeHead, AdmitRequest, Pull, VersionUpdate, DropReport, StatsRequest, Heartbeat, AbandonGroup, Ack, Acks,
    AdmitReply, GroupBatchHead, Stats,
]
RequestHead = Union[EpisodeHead, AdmitRequest, Pull, VersionUpdate, DropReport, StatsRequest, Heartbeat, AbandonGroup]
ReplyHead = Union[Ack, Acks, AdmitReply, GroupBatchHead, Stats]


class _Envelope(msgspec.Struct):
    """The fields every message has; read only to explain why a full decode failed."""

    type: str = ""
    schema_version: int = -1
    seq: int = -1


_ENCODER = encoder()
_ENVELOPE_DECODER = msgspec.msgpack.Decoder(_Envelope)


def _tags(union: object) -> frozenset[str]:
    return frozenset(cls.__struct_config__.tag for cls in union.__args__)


_KNOWN_TAGS = _tags(Head)


class HeadDecoder:
    """Decodes the first frame of a message, out of one union: structure, version, then semantics."""

    def __init__(self, union: object) -> None:
        self._decoder = decoder(union)
        self._accepted = _tags(union)

    def decode(self, data: bytes):
        try:
            message = self._decoder.decode(data)
        except RecursionError:  # msgpack nested deeper than the interpreter's stack: garbage, not a bug
            raise MessageError(REJECT_MALFORMED, "message nested too deeply") from None
        except (msgspec.DecodeError, ValueError) as exc:
            raise self._explain(data, exc) from None
        if message.schema_version != MESSAGE_SCHEMA_VERSION:
            raise _version_error(message.schema_version)
        validator = _VALIDATORS.get(type(message))
        if validator is not None:
            validator(message)
        return message

    def _explain(self, data: bytes, exc: Exception) -> MessageError:
        """Tell a foreign schema version or a misdirected message apart from plain garbage."""
        try:
            envelope = _ENVELOPE_DECODER.decode(data)
        except (msgspec.DecodeError, ValueError, RecursionError):
            return MessageError(REJECT_MALFORMED, str(exc))
        if envelope.schema_version not in (-1, MESSAGE_SCHEMA_VERSION):
            return _version_error(envelope.schema_version)
        if envelope.type in _KNOWN_TAGS and envelope.type not in self._accepted:
            return MessageError(REJECT_UNEXPECTED, f"{envelope.type} is not accepted here")
        if isinstance(exc, msgspec.ValidationError) and envelope.type in self._accepted:
            return MessageError(REJECT_INVALID, str(exc))  # well formed, but a value out of its bounds
        return MessageError(REJECT_MALFORMED, str(exc))


def _version_error(version: int) -> MessageError:
    """Name both versions, and what changed, so whoever runs the older peer knows to upgrade it."""
    detail = f"message schema {version}, expected {MESSAGE_SCHEMA_VERSION}"
    if version < MESSAGE_SCHEMA_VERSION:
        detail += (" (the peer runs an older drmas: schema 4 numbers every group by its draw, so a resume "
                   "trains every prompt; schema 3 sent each sample in a ZeroMQ frame of its own)")
    return MessageError(REJECT_SCHEMA_VERSION, detail)


HEADS = HeadDecoder(Head)
REQUEST_HEADS = HeadDecoder(RequestHead)
REPLY_HEADS = HeadDecoder(ReplyHead)
_MULTI_FRAME = (EpisodeMsg, GroupBatch, EpisodeHead, GroupBatchHead)


def encode_message(message: _Message) -> bytes:
    """Encode a message that travels as one frame (all but `EpisodeMsg` and `GroupBatch`, see
    `drmas.buffer.framing.encode_frames`) to msgpack bytes."""
    if isinstance(message, _MULTI_FRAME):
        raise TypeError(f"{type(message).__name__} travels as several frames: use drmas.buffer.framing.encode_frames")
    return _ENCODER.encode(message)


def encode_head(message: _Message) -> bytes:
    """The msgpack bytes of a head (or any one-frame message)."""
    return _ENCODER.encode(message)


def recover_seq(data: bytes) -> int:
    """The ``seq`` of a message that could not be decoded (-1 if unreadable), so its refusal can still
    be matched by the sender: a producer would otherwise wait forever on an episode it counts as unacked."""
    try:
        return _ENVELOPE_DECODER.decode(data).seq
    except (msgspec.DecodeError, ValueError, RecursionError):
        return -1


def check_sample_version(version: int) -> None:
    if version != SAMPLE_SCHEMA_VERSION:
        raise ValueError(f"sample schema version {version} is not supported (expected {SAMPLE_SCHEMA_VERSION})")


def check_in_message(sample: Sample, where: str) -> None:
    """The same checks as `drmas.core.sample.decode_sample`, for samples decoded inside a message."""
    try:
        check_sample(sample)
    except ValueError as exc:
        raise MessageError(reason_of(exc), f"{where}: {exc}") from None


def check_sample_ids(sample: Union[Sample, SampleHeader], group_id: str, episode_id: str, index: int) -> None:
    """An episode must only carry its own samples, or groups would be assembled from foreign data."""
    if sample.group_id != group_id or sample.episode_id != episode_id:
        raise MessageError(
            REJECT_INVALID,
            f"sample {index} belongs to {sample.group_id}/{sample.episode_id}, not {group_id}/{episode_id}",
        )


def _check_episode_fields(message: Union[EpisodeMsg, EpisodeHead]) -> None:
    if message.group_size < 1:
        raise MessageError(REJECT_INVALID, f"group_size must be >= 1, got {message.group_size}")
    n_samples = len(message.sample_sizes) if isinstance(message, EpisodeHead) else len(message.samples)
    # an episode in which no trained agent spoke (a router answered at once) carries only its frozen calls'
    # rewards: it still completes its group and counts in the pooled scores, as in the colocated loop
    if not n_samples and not message.frozen_rewards:
        raise MessageError(REJECT_INVALID, f"episode {message.episode_id} has no samples and no rewards")


def validate_episode(message: EpisodeMsg) -> None:
    """Every rule an `EpisodeMsg` decoded in full must meet (its fields, each sample's values and ids)."""
    _check_episode_fields(message)
    for index, sample in enumerate(message.samples):
        check_in_message(sample, f"sample {index}")
        check_sample_ids(sample, message.group_id, message.episode_id, index)


def _validate_pull(message: Pull) -> None:
    if not message.agents:
        raise MessageError(REJECT_INVALID, "pull names no agents")
    if message.max_groups < 1:
        raise MessageError(REJECT_INVALID, f"pull needs max_groups >= 1, got {message.max_groups}")


_VALIDATORS: dict[type, Callable] = {
    EpisodeHead: _check_episode_fields,
    Pull: _validate_pull,
}
