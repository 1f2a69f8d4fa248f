"""The multi-turn Search system: a router, a searcher and an answerer over a retriever.

Turn t (1..T, T = `system.max_turns`): the router reads the question and the search history and routes.
`<verify>no</verify>` -> the searcher writes `<search>query</search>`, the retriever's top-k passages for
that query join the history and the next turn starts; `<verify>yes</verify>` -> the answerer writes
`<answer>...</answer>` and the episode ends. The search agent is skipped on the last turn (no turn could
use what it finds). The router routes the last turn too, as in the reference (`system.route_last_turn`):
"no" there ends the episode without an answer (reward 0), so a router that keeps saying "no" is not
rescued by an answer it never asked for. With `route_last_turn: false` the last turn goes straight to the
answerer (the router skipped, as the math verifier is in the last round).

Malformed outputs:
* a router reply without a yes/no verdict tag is an invalid turn (format penalty); what it means for the
  episode is `system.malformed_route`: "answer" (as "yes", the reference) or "search" (as "no"). The
  reference's choice quietly rewards a router for skipping the format whenever an early answer is right;
* a searcher reply without a non-empty `<search>` query is an invalid turn; nothing is retrieved and the
  history notes the failed search, so the next agents see that the turn was spent;
* an answerer reply without `<answer>` is invalid and earns reward 0.

Reward: the final answer graded against the problem's gold answers (`meta["golden_answers"]`, else
`answer`) by exact match after normalisation, or token F1 with `system.reward_metric: f1`. The orchestra
grades with `drmas.tasks.qa_grading` itself rather than through `task.grade`, so the metric is the
system's setting whatever the task was built with. The invalid-action penalty is applied per sample by
the episode runner (`algorithm.invalid_penalty`).

Retrieval is the orchestra's one service (`RETRIEVE`): an episode yields a `ServiceCall` with its query and the
episode runner batches the queries of all episodes searching in the same round into one `search` call
(one HTTP request for a retrieval server, one BM25/faiss batch in process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Mapping, Optional, Sequence

from drmas.config.systems import ROUTES, SearchSettings
from drmas.mas import ORCHESTRAS
from drmas.mas.agents import AGENT_ROLES, RoleAgent
from drmas.mas.base import AgentTurn, EpisodeGenerator, EpisodeOutcome, ServiceCall, TurnResult
from drmas.mas.search_agents import YES, SearchContext
from drmas.retrieval.base import Hit, Retriever
from drmas.tasks.base import Problem, Task
from drmas.tasks.qa_grading import score_answer

ROUTER = "router"
SEARCHER = "searcher"
ANSWERER = "answerer"
ROLES = (ROUTER, SEARCHER, ANSWERER)
RETRIEVE = "retrieve"  # the service name episodes call with a query
MALFORMED_ANSWERS, MALFORMED_SEARCHES = ROUTES  # values of system.malformed_route


class RetrievalService:
    """The search system's service: a batch of queries -> each query's top-k hits, in one retriever call."""

    def __init__(self, retriever: Retriever, topk: int) -> None:
        self.retriever = retriever
        self.topk = topk

    def call_batch(self, queries: Sequence[str]) -> list[list[Hit]]:
        return [hits[: self.topk] for hits in self.retriever.search(list(queries), self.topk)]


@dataclass
class _Episode:
    """Mutable bookkeeping of one running episode (kept apart so `run` reads as the turn logic only)."""

    context: SearchContext
    turns: list[TurnResult] = field(default_factory=list)
    router_calls: int = 0
    malformed_verdicts: int = 0
    searches: int = 0
    failed_searches: int = 0
    retrieved_ids: list[str] = field(default_factory=list)


@ORCHESTRAS.register("search", settings=SearchSettings)
class SearchOrchestra:
    """Router/searcher/answerer loop of the Search workflow (see the module docstring for the episode rules)."""

    needs_retriever = True  # the assembly builds one from the `retrieval` config section and passes it

    def __init__(
        self,
        system_cfg: SearchSettings,
        agents_by_role: Mapping[str, str],
        task: Task,
        retriever: Retriever,
        topk: int = 3,
    ) -> None:
        _check_roles(agents_by_role)
        system_cfg.validate("system")
        if retriever is None:
            raise ValueError("the search system needs a retriever (configure the `retrieval` section)")
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"retrieval.topk must be an integer >= 1, got {topk!r}")
        self.max_turns: int = system_cfg.max_turns
        self.route_last_turn: bool = system_cfg.route_last_turn
        self.malformed_route: str = system_cfg.malformed_route
        self.history_max_chars: int = system_cfg.history_max_chars
        self.reward_metric: str = system_cfg.reward_metric
        self.task = task
        self.retriever = retriever
        self.topk = topk
        self.services = {RETRIEVE: RetrievalService(retriever, topk)}
        self.names: dict[str, str] = {role: agents_by_role[role] for role in ROLES}
        self.agents: tuple[str, ...] = tuple(self.names[role] for role in ROLES)
        self.roles: dict[str, RoleAgent] = {role: AGENT_ROLES.get(role)(system_cfg) for role in ROLES}

    def run(self, problem: Problem) -> EpisodeGenerator:
        """Yield router/searcher turns until the router says yes or the last turn, then the answerer's turn
        (none when the router said no on the last turn)."""
        episode = _Episode(context=SearchContext(history_max_chars=self.history_max_chars))
        routed_to_answer = False
        turn = 1
        while turn < self.max_turns or self.route_last_turn:
            routed_to_answer = yield from self._route(problem, episode)
            if routed_to_answer or turn == self.max_turns:
                break
            yield from self._search(problem, episode)
            turn += 1
        answer = None
        if routed_to_answer or not self.route_last_turn:
            text = yield from self._call(ANSWERER, problem, episode)
            answer = self.roles[ANSWERER].parse(text)
        return EpisodeOutcome(
            reward=self._grade(problem, answer),
            turns=episode.turns,
            final_answer=answer or "",
            info={
                "turns": turn,
                "searches": episode.searches,
                "failed_searches": episode.failed_searches,
                "router_calls": episode.router_calls,
                "malformed_verdicts": episode.malformed_verdicts,
                "routed_to_answer": routed_to_answer,
                "answered": answer is not None,
                "retrieved_ids": episode.retrieved_ids,
            },
        )

    def _route(self, problem: Problem, episode: _Episode) -> Generator[AgentTurn, str, bool]:
        """One router call; True when it says yes (answer now). A malformed verdict counts as configured."""
        text = yield from self._call(ROUTER, problem, episode)
        episode.router_calls += 1
        verdict = self.roles[ROUTER].parse(text)
        if verdict is None:
            episode.malformed_verdicts += 1
            return self.malformed_route == MALFORMED_ANSWERS
        return verdict == YES

    def _search(self, problem: Problem, episode: _Episode) -> Generator[AgentTurn | ServiceCall, object, None]:
        """One searcher call and, when it wrote a query, one retrieval whose passages join the history."""
        text = yield from self._call(SEARCHER, problem, episode)
        query = self.roles[SEARCHER].parse(text)
        if query is None:
            episode.failed_searches += 1
            episode.context.add_search(None)
            return
        hits = yield ServiceCall(RETRIEVE, query)
        episode.searches += 1
        episode.retrieved_ids.extend(hit.passage.id for hit in hits)
        episode.context.add_search(query, hits)

    def _call(self, role: str, problem: Problem, episode: _Episode) -> Generator[AgentTurn, str, str]:
        """Ask the agent playing `role`, record its validity and share its reply with the team."""
        agent = self.roles[role]
        name = self.names[role]
        text = yield AgentTurn(agent=name, messages=agent.messages(problem, episode.context))
        text = text if text is not None else ""
        episode.turns.append(TurnResult(agent=name, text=text, valid=agent.is_valid(text)))
        episode.context.add(role, text)
        return text

    def _grade(self, problem: Problem, answer: Optional[str]) -> float:
        """`system.reward_metric` of the answer against every gold answer of the problem (0 without one)."""
        if answer is None:
            return 0.0
        golds = list(problem.meta.get("golden_answers") or [problem.answer])
        return float(score_answer(answer, golds, self.reward_metric))


def _check_roles(agents_by_role: Mapping[str, str]) -> None:
    """Fail at construction, naming the role, when an agent for router, searcher or answerer is missing."""
    for role in ROLES:
        if not agents_by_role.get(role):
            known = ", ".join(f"{r}={n}" for r, n in agents_by_role.items()) or "none"
            raise ValueError(f"the search system needs an agent with role {role!r}; configured roles: {known}")

