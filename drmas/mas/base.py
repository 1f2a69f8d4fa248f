"""The multi-agent system interface.

An orchestra describes the turn logic of one episode as a Python generator: it *yields* an `AgentTurn`
(which agent speaks, with which chat messages) and is *sent* back the agent's response text; when the
episode is over it *returns* an `EpisodeOutcome`. The orchestra never touches engines, tokenizers or
processes, so one driver can interleave hundreds of episodes and batch their calls per engine, and the
same orchestra runs in the colocated loop, in rollout processes and in evaluation.

An episode may also yield a `ServiceCall` (e.g. a retrieval) and is sent back the service's result. Services
belong to the orchestra (`Orchestra.services`) but the driver makes the calls: it gathers the pending calls of
all live episodes and makes one batched call per service, so a retrieval server sees one request per round
rather than one per episode. (A service is not an LLM tool: the functions a model may call are `AgentTurn.tools`,
OpenAI function definitions rendered into its prompt, `drmas.core.tool_calls`.)

An agent turn is answered by an LLM, or by code when the agent's role is scripted (`ScriptedRole`, e.g. an
environment): the orchestra yields the same `AgentTurn` either way, so which agents are models is the
config's choice. A scripted turn makes no sample. A turn the engine cannot take (its prompt too long for the
model, messages its chat template refuses) is thrown into the episode at its `yield` as that exception: an
orchestra whose turns come from outside (the external system's gateway) catches it and reports it there;
any other lets it end the run, as a bug.

A service may also answer `PENDING` for a request whose result is not there yet because it comes from outside
the driver (an agent program calling over HTTP): the episode keeps waiting on it and is asked again next round.
Such a service has `wait_for_answers(requests)`, which the driver calls when no engine has work, to sleep until
one of those requests can be answered (or a short while).

Rewards: `EpisodeOutcome.reward` is the episode's task reward (what held-out evaluation reports as accuracy)
and, unless the orchestra says otherwise, every turn's reward. An orchestra may reward turns differently
(a verifier for a correct verdict, a tester for a test that catches a bug): `turn_rewards` gives each turn
its own, `agent_rewards` each agent. Precedence, per turn: `turn_rewards[i]` when given and not None, else
`agent_rewards[agent]` when the agent is named there, else `reward`. The format penalty
(`algorithm.invalid_penalty`) is then subtracted per invalid turn, as always.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Optional, Protocol, Sequence, Union

from drmas.tasks.base import Problem


@dataclass
class AgentTurn:
    """A request from the orchestra: agent `agent` answers `messages` (chat format)."""

    agent: str
    messages: list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}, ...]
    state: Any = None  # for a scripted agent: what the orchestra hands it besides the messages (never sent to a model)
    # this turn's sampling over the agent's configured one: temperature, top_p, seed replace it, stop strings are
    # added to it, max_new_tokens is capped by it (the gateway: what an HTTP request asked for)
    sampling: Optional[Mapping[str, Any]] = None
    detailed: bool = False  # send back a `Reply` (text, token counts, finish reason, version) instead of the text
    # functions the agent may call, as OpenAI's tool definitions ({"type": "function", "function": {"name", "description",
    # "parameters"}}), rendered into the prompt by the chat template (drmas.core.tool_calls); messages may then hold
    # assistant `tool_calls` and `tool` results
    tools: Optional[Sequence[Mapping[str, Any]]] = None


@dataclass(frozen=True)
class Reply:
    """What a turn asked with `detailed=True` is sent back: the text and what an API reply reports of it."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    version: int  # the weight version that generated it


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING: Any = _Pending()  # a service's answer for a request whose result is not there yet (see the module docstring)


_NO_ARGUMENT: Any = object()


@dataclass(init=False)
class ServiceCall:
    """A request from the orchestra to its service `service` (a key of `Orchestra.services`); the episode is sent
    back that service's result for `request`. Service calls are not agent turns: they produce no sample.

    `tool=` and `.tool` (the field's name when this was `ToolCall`) still work for one release, with a
    DeprecationWarning."""

    service: str
    request: Any

    def __init__(self, service: str = _NO_ARGUMENT, request: Any = _NO_ARGUMENT, *, tool: str = _NO_ARGUMENT) -> None:
        if tool is not _NO_ARGUMENT:
            if service is not _NO_ARGUMENT:
                raise TypeError("ServiceCall takes `service` or the deprecated `tool`, not both")
            warnings.warn("ServiceCall(tool=...) is deprecated: name the service with `service=`",
                          DeprecationWarning, stacklevel=2)
            service = tool
        if service is _NO_ARGUMENT or request is _NO_ARGUMENT:
            raise TypeError("ServiceCall needs a service name and a request")
        self.service, self.request = service, request

    @property
    def tool(self) -> str:
        """Deprecated: `service`."""
        warnings.warn("ServiceCall.tool is deprecated: read `service`", DeprecationWarning, stacklevel=2)
        return self.service


class Service(Protocol):
    """Something an orchestra's episodes call between agent turns, batched across episodes by the driver."""

    def call_batch(self, requests: Sequence[Any]) -> list[Any]:
        """One result per request, in order (`PENDING` for one not answerable yet, see the module docstring).
        An exception ends the driver's run, so a service that can recover from a failure (e.g. by retrying) does
        so itself."""
        ...


@dataclass
class TurnResult:
    """What the orchestra decided about one answered turn (validity of the agent's output format)."""

    agent: str
    text: str
    valid: bool


@dataclass
class EpisodeOutcome:
    """The end of an episode: its task reward, per-turn validity and, optionally, rewards per turn or agent
    (see the module docstring for which reward a turn gets)."""

    reward: float  # task reward in [0, 1]: every turn's reward unless turn_rewards / agent_rewards say otherwise
    turns: list[TurnResult]  # one per yielded AgentTurn, in order (scripted agents' turns included)
    final_answer: str = ""
    info: dict = field(default_factory=dict)  # orchestra statistics (rounds used, approvals, ...)
    turn_rewards: Optional[list[Optional[float]]] = None  # one per turn (None entries: fall back, see above)
    agent_rewards: Optional[dict[str, float]] = None  # agent name (not role) -> the reward of its turns
    # why the episode did not finish (an agent program never reported its reward): it makes no samples, and its
    # GRPO group cannot complete, so the whole group is dropped like any incomplete one
    dropped: str = ""

    def turn_reward(self, index: int) -> float:
        """The reward of turn `index` before the format penalty: turn_rewards, else agent_rewards, else reward."""
        if self.turn_rewards is not None and self.turn_rewards[index] is not None:
            return float(self.turn_rewards[index])
        agent = self.turns[index].agent
        if self.agent_rewards is not None and agent in self.agent_rewards:
            return float(self.agent_rewards[agent])
        return float(self.reward)


EpisodeGenerator = Generator[Union[AgentTurn, ServiceCall], Any, EpisodeOutcome]


class Orchestra(Protocol):
    """Turn logic of one multi-agent system; `agents` lists the agent names it needs, `services` the services
    its episodes call by name (empty for a system without any; an orchestra that has the deprecated `tools`
    instead still works, with a DeprecationWarning).

    The driver runs its code (episode steps, scripted roles, services) in a thread of its own, bounded in time
    (`drmas.episodes.bounds`); an orchestra whose code must run in the driver's own thread sets an attribute
    `driver_thread = True` (the external system: the program it starts is bound to the thread that starts it)."""

    agents: tuple[str, ...]
    services: Mapping[str, Service]

    def run(self, problem: Problem) -> EpisodeGenerator:
        """Yield AgentTurns (sent back response texts) and ServiceCalls (sent back service results); return the
        EpisodeOutcome."""
        ...
