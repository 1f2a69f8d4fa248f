"""The three roles of the multi-turn search system and the search history they share.

Router, searcher and answerer only read the question and the *search history* (the queries made so far and
the passages each one retrieved); they never see each other's raw replies. The history is the team's
memory, and it is what grows with every turn, so it is capped (`system.history_max_chars`): the newest
entries are kept whole and older ones are dropped, because the latest retrieval is the one that the next
decision depends on.

As for the math roles (`drmas.mas.agents`), the prompts target SmolLM2-135M-Instruct: a one-line system
instruction, a few literal worked exchanges whose reply is nothing but the tag, and the expected format
repeated as the request's last line, because a tiny model copies a concrete, recent pattern far more
reliably than it follows a described format. The worked examples use a small invented world (Mara Quill,
Tessin, Velmora, Brightmoor) so that no task answer leaks into a prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from drmas.mas.agents import AGENT_ROLES, RoleAgent, TeamContext
from drmas.retrieval.base import Hit, Passage
from drmas.tasks.base import Problem
from drmas.tasks.qa_grading import extract_answer

YES = "yes"
NO = "no"

# Tag readers tolerate spaces inside the tags and any letter case, since small models drift on both; when a
# reply holds several tags the last one wins (the agent's conclusion), as for the math verifier.
_ROUTE_RE = re.compile(r"<\s*verify\s*>\s*(yes|no)\s*<\s*/\s*verify\s*>", re.IGNORECASE)
_SEARCH_RE = re.compile(r"<\s*search\s*>(.*?)<\s*/\s*search\s*>", re.IGNORECASE | re.DOTALL)

NO_RESULTS = "Search results: none yet."
FAILED_SEARCH = "Search failed: no <search>query</search> was written."
_ENTRY_SEPARATOR = "\n\n"
_ELLIPSIS = "..."


# ------------------------------------------------------------------------------------------ history


@dataclass(frozen=True)
class HistoryEntry:
    """One search turn: the query and its passages, or `query=None` for a search that produced no query."""

    query: Optional[str]
    passages: tuple[Passage, ...] = ()

    def render(self) -> str:
        if self.query is None:
            return FAILED_SEARCH
        lines = [f"Search: {self.query}"]
        if not self.passages:
            lines.append("(no passages found)")
        for rank, passage in enumerate(self.passages, start=1):
            lines.append(f"({rank}) {passage.title}: {' '.join(passage.text.split())}")
        return "\n".join(lines)


def render_history(entries: Sequence[HistoryEntry], max_chars: int) -> str:
    """The newest entries that fit in `max_chars` characters together, oldest first, cut at entry boundaries.

    An entry is shown whole or not at all, except when the newest entry alone is longer than the cap: it is
    then cut to `max_chars` characters (ending in "..."), so the agents always see the latest retrieval.
    Returns "" when there are no entries.
    """
    kept: list[str] = []
    used = 0
    for entry in reversed(entries):
        text = entry.render()
        cost = len(text) + (len(_ENTRY_SEPARATOR) if kept else 0)
        if used + cost > max_chars:
            if not kept:  # the newest entry alone is over the cap: show its beginning
                kept.append(text[: max(0, max_chars - len(_ELLIPSIS))] + _ELLIPSIS)
            break
        kept.append(text)
        used += cost
    return _ENTRY_SEPARATOR.join(reversed(kept))


@dataclass
class SearchContext(TeamContext):
    """The team context of a search episode: the replies of every role plus the capped search history."""

    history_max_chars: int = 2000
    history: list[HistoryEntry] = field(default_factory=list)

    def add_search(self, query: Optional[str], hits: Sequence[Hit] = ()) -> None:
        """Record a search turn: `query` with its retrieved `hits`, or `query=None` for a failed search."""
        self.history.append(HistoryEntry(query, tuple(hit.passage for hit in hits)))

    def shown_history(self) -> str:
        """What the agents are shown of the history (capped; see `render_history`)."""
        return render_history(self.history, self.history_max_chars)


def search_request(problem: Problem, context: TeamContext) -> str:
    """The user message shared by the three roles: the question, then the search results so far."""
    shown = context.shown_history() if isinstance(context, SearchContext) else ""
    results = f"Search results:\n{shown}" if shown else NO_RESULTS
    return f"Question: {problem.question}\n{results}"


# ------------------------------------------------------------------------------------- worked examples

_DEMO_ONE_HOP = Problem("demo-1hop", "In which city was Mara Quill born?", "Tessin")
_DEMO_TWO_HOP = Problem("demo-2hop", "In which country is the city where Mara Quill was born?", "Velmora")
_DEMO_EMPLOYER = Problem("demo-year", "In which year was Brightmoor founded?", "1911")
_DEMO_MARA = Passage("demo-w1", "Mara Quill\nMara Quill is a painter. She was born in Tessin and works for Brightmoor.")
_DEMO_TESSIN = Passage("demo-w2", "Tessin\nTessin is a city in Velmora. It lies on the river Oska.")
_DEMO_BRIGHTMOOR = Passage("demo-w3", "Brightmoor\nBrightmoor is a paint company. It was founded in 1911 by Edda Pell.")


def _demo_context(*searches: tuple[str, tuple[Passage, ...]]) -> SearchContext:
    context = SearchContext()
    for query, passages in searches:
        context.history.append(HistoryEntry(query, passages))
    return context


_NOTHING_YET = _demo_context()
_FOUND_MARA = _demo_context(("Mara Quill born", (_DEMO_MARA,)))
_FOUND_BRIGHTMOOR = _demo_context(("Brightmoor founded", (_DEMO_BRIGHTMOOR,)))
_FOUND_BOTH = _demo_context(("Mara Quill born", (_DEMO_MARA,)), ("Tessin country", (_DEMO_TESSIN,)))


class _SearchRole(RoleAgent):
    """Common prompt layout of the search roles: the question, the search results, then the role's cue.

    The cue repeats the expected reply format as the very last line: a tiny model's reply follows the end
    of the prompt much more than the system message, which sits hundreds of tokens earlier.
    """

    cue: str

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        return f"{search_request(problem, context)}\n{self.cue}"


# ------------------------------------------------------------------------------------------- roles


@AGENT_ROLES.register("router")
class RouterAgent(_SearchRole):
    """Decides each turn whether the results suffice: <verify>yes</verify> (answer now) or <verify>no</verify>."""

    role = "router"
    stop = ("</verify>",)
    cue = "Is the answer in the results? Reply <verify>no</verify> if not, <verify>yes</verify> if it is."

    def system_prompt(self) -> str:
        return "You check if search results answer a question. Reply only <verify>yes</verify> or <verify>no</verify>."

    def demonstrations(self) -> list[tuple[str, str]]:
        # Both verdicts, "no" on empty and on partial results. With only one "no" SmolLM2-135M said "yes" on
        # 13 of 20 first turns (nothing found yet); with these four the verdicts split about evenly.
        return [
            (self.user_prompt(_DEMO_ONE_HOP, _NOTHING_YET), "<verify>no</verify>"),
            (self.user_prompt(_DEMO_ONE_HOP, _FOUND_MARA), "<verify>yes</verify>"),
            (self.user_prompt(_DEMO_TWO_HOP, _FOUND_MARA), "<verify>no</verify>"),
            (self.user_prompt(_DEMO_EMPLOYER, _NOTHING_YET), "<verify>no</verify>"),
        ]

    def parse(self, text: str) -> Optional[str]:
        """"yes" or "no" from the last verdict tag; None without one (a tag holding anything else is none)."""
        found = _ROUTE_RE.findall(text)
        return found[-1].lower() if found else None


@AGENT_ROLES.register("searcher")
class SearcherAgent(_SearchRole):
    """Writes the next search query as <search>query</search>."""

    role = "searcher"
    stop = ("</search>",)
    cue = "Write a short search query in <search></search>."

    def system_prompt(self) -> str:
        return "You write a short search query for the fact still missing. Reply only <search>query</search>."

    def demonstrations(self) -> list[tuple[str, str]]:
        # A first query, then a second hop built from what the first search found.
        return [
            (self.user_prompt(_DEMO_ONE_HOP, _NOTHING_YET), "<search>Mara Quill born</search>"),
            (self.user_prompt(_DEMO_TWO_HOP, _FOUND_MARA), "<search>Tessin country</search>"),
            (self.user_prompt(_DEMO_EMPLOYER, _NOTHING_YET), "<search>Brightmoor founded</search>"),
        ]

    def parse(self, text: str) -> Optional[str]:
        """The last <search> query with whitespace collapsed; None when absent or empty."""
        found = _SEARCH_RE.findall(text)
        query = " ".join(found[-1].split()) if found else ""
        return query or None


@AGENT_ROLES.register("answerer")
class AnswererAgent(_SearchRole):
    """Gives the final short answer as <answer>...</answer>."""

    role = "answerer"
    stop = ("</answer>",)
    cue = "Write the short answer in <answer></answer>."

    def system_prompt(self) -> str:
        return "You answer a question from search results. Reply only <answer>short answer</answer>."

    def demonstrations(self) -> list[tuple[str, str]]:
        return [
            (self.user_prompt(_DEMO_ONE_HOP, _FOUND_MARA), "<answer>Tessin</answer>"),
            (self.user_prompt(_DEMO_TWO_HOP, _FOUND_BOTH), "<answer>Velmora</answer>"),
            (self.user_prompt(_DEMO_EMPLOYER, _FOUND_BRIGHTMOOR), "<answer>1911</answer>"),
        ]

    def parse(self, text: str) -> Optional[str]:
        """The content of the last <answer> tag, read as the reward reads it
        (`drmas.tasks.qa_grading.extract_answer`); None when there is no tag or it is empty."""
        answer = extract_answer(text)
        answer = answer.strip() if answer is not None else ""
        return answer or None
