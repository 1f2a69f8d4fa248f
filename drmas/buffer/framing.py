"""How buffer messages map onto ZeroMQ frames, and the views of them the buffer and its clients read.

Message schema 3 and later: a message is one msgpack head frame, followed -- for the two messages that carry samples,
`EpisodeMsg` and `GroupBatch` -- by frames of samples (`drmas.core.sample.encode_sample` bytes). The head lists
every sample's size. A sample of `OWN_FRAME_BYTES` or more travels in a frame of its own; smaller ones are
joined, in order, into one frame between two large ones (`pack`).

Why: the buffer receives an episode without a copy (`recv_multipart(copy=False)`), checks each sample where
it lies and keeps it there. A large sample is sent on to a learner as the very frame it arrived in: libzmq
shares a received message by reference count, so it is never re-encoded, copied, or handed to pyzmq's
zero-copy garbage thread. Small samples are joined instead: a ZeroMQ frame costs a read, a message and a
Python object on each side, which for a 10 KiB sample is several times what copying its bytes once costs
(measured: 128 samples of 10 KiB as 128 frames took ~3x the CPU of the same bytes in one frame).

* `decode_buffer_request` (the buffer): an episode's samples stay where they arrived (`EpisodeView`),
  checked one by one by `validated_samples`; the buffer forwards them in a `GroupBatchView`.
* `decode_client_reply` + `open_group` (the clients): a batch is opened group by group, so one bad sample
  costs its own group rather than the whole batch.
* `encode_frames` / `decode_message` encode and decode any message in full (clients, tools and tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import msgspec
import zmq

from drmas.buffer.messages import (
    HEADS,
    REJECT_FRAMING,
    REJECT_OVERSIZED,
    REPLY_HEADS,
    REQUEST_HEADS,
    Ack,
    Acks,
    AdmitReply,
    AgentGroup,
    EpisodeHead,
    EpisodeMsg,
    GroupBatch,
    GroupBatchHead,
    GroupHead,
    HeadDecoder,
    Message,
    MessageError,
    SampleHeader,
    Stats,
    check_sample_ids,
    check_sample_version,
    encode_head,
    encode_message,
    validate_episode,
)
from drmas.core.sample import Sample, decode_sample, encode_sample, reason_of

# A frame as it arrives (`zmq.Frame`, received with copy=False) or as it is built (bytes, memoryview); a
# sample is one of these, or a memoryview of its part of a frame of joined samples.
FrameLike = Any
# pyzmq's own threshold: it copies smaller buffers anyway, and sends larger ones without a copy
OWN_FRAME_BYTES = zmq.COPY_THRESHOLD

_HEADER_DECODER = msgspec.msgpack.Decoder(SampleHeader)


@dataclass(slots=True)
class EpisodeView:
    """`EpisodeMsg` as the buffer reads it: its head's fields, and its samples still as received frames."""

    producer: str
    seq: int
    group_id: str
    group_size: int
    episode_id: str
    frozen_rewards: list[float]
    samples: list[FrameLike]
    draw: int = -1
    prompt: str = ""


@dataclass(slots=True)
class AgentGroupView:
    """`AgentGroup` with its samples as frames: what the buffer forwards, and what a learner opens.

    `checked`: the buffer checked every sample in full, so `open_group` only decodes them."""

    group_id: str
    agent: str
    model: str
    samples: list[FrameLike]
    episode_scores: dict[str, float]
    group_rewards: list[float]
    checked: bool = False
    draw: int = -1
    prompt: str = ""
    group_agents: list[str] = field(default_factory=list)


@dataclass(slots=True)
class GroupBatchView:
    """`GroupBatch` as the buffer sends it and a learner receives it (groups not opened yet)."""

    seq: int
    groups: list[AgentGroupView]
    instance: str = ""
    checked: bool = False


ClientReply = Union[Ack, Acks, AdmitReply, GroupBatchView, Stats]


def data_of(frame: FrameLike) -> Any:
    """The bytes of a frame, as a buffer (no copy)."""
    return frame.buffer if isinstance(frame, zmq.Frame) else frame


# ---- encoding ---------------------------------------------------------------------------------------


def pack(samples: Sequence[FrameLike]) -> tuple[list[int], list[FrameLike]]:
    """The sizes of `samples` and their frames: each large sample alone (a received frame goes on by
    reference), each run of small ones joined into one frame (one copy of their bytes)."""
    sizes, frames, run = [], [], []
    for sample in samples:
        size = len(sample)
        sizes.append(size)
        if size < OWN_FRAME_BYTES:
            run.append(data_of(sample))
            continue
        if run:
            frames.append(b"".join(run))
            run = []
        frames.append(sample)
    if run:
        frames.append(b"".join(run))
    return sizes, frames


def _unpack(frames: Sequence[FrameLike], sizes: Sequence[int]) -> list[FrameLike]:
    """The samples in `frames`, by `sizes`: a frame that is one sample stays the frame (to be forwarded as it
    is), samples joined in a frame become views of it. A size that straddles two frames or does not add up
    is refused: it would shift every later sample into the wrong group."""
    samples: list[FrameLike] = []
    index, count = 0, len(sizes)
    for frame in frames:
        length = len(frame)
        if index < count and sizes[index] == length:
            samples.append(frame)
            index += 1
            continue
        view, at = memoryview(data_of(frame)), 0
        while at < length:
            if index == count or at + sizes[index] > length:
                raise MessageError(REJECT_FRAMING, f"sample frames of {[len(f) for f in frames]} bytes do not "
                                                   f"hold samples of {list(sizes)} bytes")
            samples.append(view[at:at + sizes[index]])
            at += sizes[index]
            index += 1
    if index != count:
        raise MessageError(REJECT_FRAMING, f"{count} samples announced, the frames hold {index}")
    return samples


def encode_frames(message: object) -> list[FrameLike]:
    """The frames of any message: the head, then (episodes and batches) the sample frames (`pack`)."""
    if isinstance(message, EpisodeMsg):
        sizes, frames = pack([encode_sample(sample) for sample in message.samples])
        head = EpisodeHead(producer=message.producer, seq=message.seq, group_id=message.group_id,
                           group_size=message.group_size, episode_id=message.episode_id, sample_sizes=sizes,
                           frozen_rewards=message.frozen_rewards, draw=message.draw, prompt=message.prompt)
        return [encode_head(head), *frames]
    if isinstance(message, GroupBatch):
        view = GroupBatchView(seq=message.seq, instance=message.instance, groups=[
            AgentGroupView(group_id=g.group_id, agent=g.agent, model=g.model, episode_scores=g.episode_scores,
                           group_rewards=g.group_rewards, samples=[encode_sample(s) for s in g.samples],
                           draw=g.draw, prompt=g.prompt, group_agents=g.group_agents)
            for g in message.groups
        ])
        return encode_frames(view)
    if isinstance(message, GroupBatchView):
        sizes, frames = pack([sample for g in message.groups for sample in g.samples])
        at, groups = 0, []
        for g in message.groups:
            groups.append(GroupHead(group_id=g.group_id, agent=g.agent, model=g.model,
                                    sample_sizes=sizes[at:at + len(g.samples)], episode_scores=g.episode_scores,
                                    group_rewards=g.group_rewards, draw=g.draw, prompt=g.prompt,
                                    group_agents=g.group_agents))
            at += len(g.samples)
        head = GroupBatchHead(seq=message.seq, instance=message.instance, checked=message.checked, groups=groups)
        return [encode_head(head), *frames]
    return [encode_message(message)]


# ---- decoding ---------------------------------------------------------------------------------------


def _decode(frames: Sequence[FrameLike], max_bytes: Optional[int], heads: HeadDecoder) -> tuple[Any, list]:
    """The head, after the cheap checks (size, frame count), and the samples its sample frames hold."""
    if max_bytes is not None:
        size = sum(len(frame) for frame in frames)
        if size > max_bytes:
            raise MessageError(REJECT_OVERSIZED, f"{size} bytes > limit {max_bytes}")
    if not frames:
        raise MessageError(REJECT_FRAMING, "no frames")
    head = heads.decode(data_of(frames[0]))
    if isinstance(head, EpisodeHead):
        return head, _unpack(frames[1:], head.sample_sizes)
    if isinstance(head, GroupBatchHead):
        return head, _unpack(frames[1:], [size for group in head.groups for size in group.sample_sizes])
    if len(frames) > 1:
        raise MessageError(REJECT_FRAMING, f"{type(head).__name__} carries no samples, yet {len(frames) - 1} "
                                           "frames follow it")
    return head, []


def decode_buffer_request(frames: Sequence[FrameLike], max_bytes: Optional[int] = None):
    """Decode a request arriving at the buffer (the frames after the identity); an episode's samples stay
    where they arrived (see `validated_samples`)."""
    head, samples = _decode(frames, max_bytes, REQUEST_HEADS)
    if isinstance(head, EpisodeHead):
        return EpisodeView(producer=head.producer, seq=head.seq, group_id=head.group_id,
                           group_size=head.group_size, episode_id=head.episode_id,
                           frozen_rewards=head.frozen_rewards, samples=samples, draw=head.draw, prompt=head.prompt)
    return head


def decode_client_reply(frames: Sequence[FrameLike]) -> ClientReply:
    """Decode a reply from the buffer; a group batch stays a `GroupBatchView` for `open_group`.

    Opening groups one by one means a single undecodable sample costs its own group (which the
    learner reports as dropped), not every group of the batch.
    """
    head, samples = _decode(frames, None, REPLY_HEADS)
    if not isinstance(head, GroupBatchHead):
        return head
    groups, at = [], 0
    for group in head.groups:
        n_samples = len(group.sample_sizes)
        groups.append(AgentGroupView(group_id=group.group_id, agent=group.agent, model=group.model,
                                     samples=samples[at:at + n_samples], episode_scores=group.episode_scores,
                                     group_rewards=group.group_rewards, checked=head.checked, draw=group.draw,
                                     prompt=group.prompt, group_agents=group.group_agents))
        at += n_samples
    return GroupBatchView(seq=head.seq, groups=groups, instance=head.instance, checked=head.checked)


def decode_message(data: Union[bytes, Sequence[FrameLike]], max_bytes: Optional[int] = None) -> Message:
    """Decode and validate any message in full, from its frames (or the bytes of a one-frame message);
    raises `MessageError` with a reason code on any defect."""
    frames = [data] if isinstance(data, (bytes, bytearray, memoryview, zmq.Frame)) else list(data)
    head, raw_samples = _decode(frames, max_bytes, HEADS)
    if isinstance(head, EpisodeHead):
        samples = []
        for index, raw in enumerate(raw_samples):
            try:
                samples.append(decode_sample(data_of(raw), check=False))  # `validate_episode` checks them
            except (msgspec.DecodeError, ValueError) as exc:
                raise MessageError(reason_of(exc), f"sample {index}: {exc}") from None
        message = EpisodeMsg(producer=head.producer, seq=head.seq, group_id=head.group_id,
                             group_size=head.group_size, episode_id=head.episode_id, samples=samples,
                             frozen_rewards=head.frozen_rewards, draw=head.draw, prompt=head.prompt)
        validate_episode(message)
        return message
    if isinstance(head, GroupBatchHead):
        batch = decode_client_reply(frames)
        return GroupBatch(seq=batch.seq, instance=batch.instance,
                          groups=[open_group(view, checked=False) for view in batch.groups])
    return head


def open_group(view: AgentGroupView, checked: Optional[bool] = None) -> AgentGroup:
    """Decode every sample of one delivered group, and check them unless the buffer did (`view.checked`;
    `checked` overrides it); `MessageError` (reason: why the sample is refused, see
    `drmas.core.sample.reason_of`) if any is bad."""
    check = not (view.checked if checked is None else checked)
    samples = []
    for index, frame in enumerate(view.samples):
        try:
            samples.append(decode_sample(data_of(frame), check=check))
        except (msgspec.DecodeError, ValueError) as exc:
            raise MessageError(reason_of(exc), f"group {view.group_id} sample {index}: {exc}") from None
    return AgentGroup(
        group_id=view.group_id, agent=view.agent, model=view.model, samples=samples,
        episode_scores=view.episode_scores, group_rewards=view.group_rewards, draw=view.draw, prompt=view.prompt,
        group_agents=list(view.group_agents),
    )


def validated_samples(
    episode: EpisodeView, full: bool = True, max_tokens: Optional[int] = None
) -> list[tuple[Union[Sample, SampleHeader], FrameLike]]:
    """Check an episode's sample frames and pair each with its decoded fields.

    `full` decodes every sample completely (types, finite values, token/log-prob lengths, at most
    `max_tokens` tokens), so a bad sample is refused at its producer instead of breaking a learner's whole
    batch later; without it only the routing header (names, version, finite rewards) is checked, which is
    several times cheaper for trusted producers. The `MessageError` reason says which rule failed.
    """
    pairs = []
    for index, frame in enumerate(episode.samples):
        data = data_of(frame)
        try:
            sample = decode_sample(data, max_tokens) if full else _decode_header(data)
        except (msgspec.DecodeError, ValueError) as exc:
            raise MessageError(reason_of(exc), f"sample {index}: {exc}") from None
        check_sample_ids(sample, episode.group_id, episode.episode_id, index)
        pairs.append((sample, frame))
    return pairs


def _decode_header(data: Any) -> SampleHeader:
    header = _HEADER_DECODER.decode(data)
    check_sample_version(header.schema_version)
    return header
