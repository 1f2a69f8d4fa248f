"""Driving an orchestra's episode by hand: each turn it asks for is answered with the next scripted reply.

Orchestras are pure turn logic (generators), so their routing rules are tested by scripting the agents'
replies and checking which agent was asked for what, and what the episode returned. Service calls (retrievals)
are answered by the orchestra's real services, one at a time, and recorded apart from the agent turns.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from drmas.mas import AgentTurn, EpisodeOutcome, ServiceCall
from drmas.tasks.base import Problem


@dataclass
class Transcript:
    """What happened in one hand-driven episode: the turns asked for and the outcome returned."""

    asked: list[AgentTurn]
    outcome: EpisodeOutcome
    service_calls: list[ServiceCall]


def drive(orchestra, responses: list[str], problem: Problem) -> Transcript:
    """Answer each yielded turn with the next scripted response; fail if the script length is wrong."""
    episode = orchestra.run(problem)
    service_calls: list[ServiceCall] = []

    def next_turn(reply) -> AgentTurn:
        request = episode.send(reply)
        while isinstance(request, ServiceCall):
            service_calls.append(request)
            request = episode.send(orchestra.services[request.service].call_batch([request.request])[0])
        return request

    asked = [next_turn(None)]
    for i, text in enumerate(responses):
        try:
            asked.append(next_turn(text))
        except StopIteration as stop:
            assert i == len(responses) - 1, f"episode ended after {i + 1} calls, script has {len(responses)}"
            return Transcript(asked=asked, outcome=stop.value, service_calls=service_calls)
    pytest.fail(f"episode still running after {len(responses)} scripted responses")


def agents_asked(transcript: Transcript) -> list[str]:
    return [turn.agent for turn in transcript.asked]
