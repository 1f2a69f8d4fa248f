"""The Search router/searcher/answerer orchestra, driven by hand over the real BM25 retriever.

Each routing test plays the LLM: it feeds scripted response texts into the orchestra's generator, exactly as
the episode runner does, and checks which agent was asked, with what prompt, what was retrieved and the
returned outcome. One test builds the system from a config (generated world + BM25 over its corpus) and
answers a 2-hop question by hand; the last runs a GRPO group of whole episodes on a tiny random model through
`EpisodeRunner` and the embedded engine. A random model writes no tags, so that group takes the malformed
paths (no retrieval happens there); real queries reach the retriever in the scripted tests.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from drmas.api.testing import Transcript
from drmas.api.testing import play_orchestra as _drive
from drmas.config.systems import SearchSettings
from drmas.mas import ORCHESTRAS, AgentTurn
from drmas.mas.agents import AGENT_ROLES
from drmas.mas.search import SearchOrchestra
from drmas.mas.search_agents import (
    FAILED_SEARCH,
    NO_RESULTS,
    AnswererAgent,
    HistoryEntry,
    RouterAgent,
    SearchContext,
    SearcherAgent,
    render_history,
)
from drmas.retrieval.base import Passage
from drmas.retrieval.bm25 import BM25Retriever
from drmas.tasks.base import Problem

PASSAGES = [
    Passage("w0", "Orla Fenwick\nOrla Fenwick is a sculptor. She was born in Brackwater and works for Duneglass."),
    Passage("w1", "Brackwater\nBrackwater is a harbour city in Lunaria. It was founded in 1702."),
    Passage("w2", "Duneglass\nDuneglass is a glass company founded by Piet Arroway. It is based in Cindervale."),
    Passage("w3", "Piet Arroway\nPiet Arroway is an engineer born in Cindervale. He plays the cello."),
    Passage("w4", "Cindervale\nCindervale is a mountain town in Osterfell. Its river is the Narl."),
]
PROBLEM = Problem(
    "q0",
    "In which country is the city where Orla Fenwick was born?",
    "Lunaria",
    meta={"golden_answers": ["Lunaria", "Republic of Lunaria"], "hops": 2, "support_ids": ["w0", "w1"]},
)
ROLES = {"router": "rita", "searcher": "sam", "answerer": "ana"}

YES = "<verify>yes</verify>"
NO = "<verify>no</verify>"
SEARCH_ORLA = "<search>Orla Fenwick born</search>"
SEARCH_BRACKWATER = "<search>Brackwater country</search>"
ANSWER = "<answer>Lunaria</answer>"


def drive(orchestra, responses: list[str], problem: Problem = PROBLEM) -> Transcript:
    return _drive(orchestra, responses, problem)


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> BM25Retriever:
    return BM25Retriever(PASSAGES, index_dir=tmp_path_factory.mktemp("bm25"), show_progress=False)


def make(retriever, max_turns: int = 4, history_max_chars: int = 2000, reward_metric: str = "em", topk: int = 3,
         **system):
    cfg = SearchSettings(
        max_turns=max_turns, history_max_chars=history_max_chars, reward_metric=reward_metric,
        **system,
    )
    return SearchOrchestra(cfg, ROLES, task=None, retriever=retriever, topk=topk)


def request(turn: AgentTurn) -> str:
    return turn.messages[-1]["content"]


# --- routing, turn by turn ----------------------------------------------------------------------------------


def test_router_no_searches_and_the_passages_reach_the_next_prompts(retriever) -> None:
    t = drive(make(retriever), [NO, SEARCH_ORLA, YES, ANSWER])
    assert t.agents_asked() == ["rita", "sam", "rita", "ana"]
    assert NO_RESULTS in request(t.asked[0]) and NO_RESULTS in request(t.asked[1])
    for later in (t.asked[2], t.asked[3]):  # router turn 2 and the answerer both see the retrieval
        text = request(later)
        assert "Search: Orla Fenwick born" in text
        assert "(1) Orla Fenwick: Orla Fenwick is a sculptor. She was born in Brackwater" in text
    assert t.outcome.info["retrieved_ids"][0] == "w0"
    assert len(t.outcome.info["retrieved_ids"]) == 3
    assert t.outcome.reward == 1.0 and t.outcome.final_answer == "Lunaria"


def test_router_yes_on_turn_one_goes_straight_to_the_answerer(retriever) -> None:
    t = drive(make(retriever), [YES, ANSWER])
    assert t.agents_asked() == ["rita", "ana"]
    assert t.outcome.info == {
        "turns": 1,
        "searches": 0,
        "failed_searches": 0,
        "router_calls": 1,
        "malformed_verdicts": 0,
        "routed_to_answer": True,
        "answered": True,
        "retrieved_ids": [],
    }
    assert t.outcome.reward == 1.0


def test_two_hops_retrieve_both_support_passages(retriever) -> None:
    t = drive(make(retriever), [NO, SEARCH_ORLA, NO, SEARCH_BRACKWATER, YES, ANSWER])
    assert t.agents_asked() == ["rita", "sam", "rita", "sam", "rita", "ana"]
    ids = t.outcome.info["retrieved_ids"]
    assert ids[0] == "w0" and ids[3] == "w1"  # each query's top-1 is its hop's support passage
    answer_prompt = request(t.asked[-1])
    assert answer_prompt.index("Search: Orla Fenwick born") < answer_prompt.index("Search: Brackwater country")
    assert t.outcome.info["turns"] == 3 and t.outcome.info["searches"] == 2


def test_the_router_routes_the_last_turn_and_yes_there_answers(retriever) -> None:
    t = drive(make(retriever, max_turns=2), [NO, SEARCH_ORLA, YES, ANSWER])
    assert t.agents_asked() == ["rita", "sam", "rita", "ana"]  # no searcher on the last turn, the router as always
    info = t.outcome.info
    assert (info["turns"], info["router_calls"], info["routed_to_answer"]) == (2, 2, True)
    assert t.outcome.reward == 1.0 and "Search: Orla Fenwick born" in request(t.asked[-1])


def test_no_on_the_last_turn_ends_the_episode_without_an_answer(retriever) -> None:
    """As in the reference: a router that never says yes gets no answer, so the episode's reward is 0."""
    t = drive(make(retriever, max_turns=4), [NO, SEARCH_ORLA] * 3 + [NO])
    assert t.agents_asked() == ["rita", "sam"] * 3 + ["rita"]
    info = t.outcome.info
    assert (info["turns"], info["router_calls"], info["searches"]) == (4, 4, 3)
    assert (info["routed_to_answer"], info["answered"], t.outcome.final_answer) == (False, False, "")
    assert t.outcome.reward == 0.0


def test_a_single_turn_is_router_then_answerer_or_nothing(retriever) -> None:
    t = drive(make(retriever, max_turns=1), [YES, ANSWER])
    assert t.agents_asked() == ["rita", "ana"] and t.outcome.reward == 1.0
    t = drive(make(retriever, max_turns=1), [NO])
    assert t.agents_asked() == ["rita"] and t.outcome.reward == 0.0 and t.outcome.info["answered"] is False


def test_route_last_turn_off_skips_router_and_searcher_on_the_last_turn(retriever) -> None:
    t = drive(make(retriever, max_turns=2, route_last_turn=False), [NO, SEARCH_ORLA, ANSWER])
    assert t.agents_asked() == ["rita", "sam", "ana"]
    assert t.outcome.info["turns"] == 2
    assert t.outcome.info["router_calls"] == 1
    assert t.outcome.info["routed_to_answer"] is False
    assert "Search: Orla Fenwick born" in request(t.asked[-1])
    t = drive(make(retriever, max_turns=4, route_last_turn=False), [NO, SEARCH_ORLA] * 3 + [ANSWER])
    assert t.agents_asked() == ["rita", "sam"] * 3 + ["ana"] and t.outcome.reward == 1.0


def test_route_last_turn_off_makes_a_single_turn_answerer_only(retriever) -> None:
    t = drive(make(retriever, max_turns=1, route_last_turn=False), [ANSWER])
    assert t.agents_asked() == ["ana"]
    assert t.outcome.info["router_calls"] == 0 and t.outcome.info["turns"] == 1
    assert NO_RESULTS in request(t.asked[0])


def test_topk_limits_the_passages_per_search(retriever) -> None:
    t = drive(make(retriever, topk=2), [NO, SEARCH_ORLA, YES, ANSWER])
    assert len(t.outcome.info["retrieved_ids"]) == 2
    assert "(2) " in request(t.asked[2]) and "(3) " not in request(t.asked[2])


# --- malformed outputs -----------------------------------------------------------------------------------------


MALFORMED_ROUTES = ["I think we need more.", "<verify>maybe</verify>", "<verify>approve</verify>"]


@pytest.mark.parametrize("malformed", MALFORMED_ROUTES)
def test_malformed_router_reply_counts_as_yes_by_default(retriever, malformed: str) -> None:
    """The reference's choice: no verdict tag -> answer now (still an invalid turn)."""
    for max_turns in (3, 1):  # also on the last turn, where "no" would end the episode unanswered
        t = drive(make(retriever, max_turns=max_turns), [malformed, ANSWER])
        assert t.agents_asked() == ["rita", "ana"]
        assert t.outcome.info["malformed_verdicts"] == 1 and t.outcome.info["routed_to_answer"] is True
        assert [turn.valid for turn in t.outcome.turns] == [False, True] and t.outcome.reward == 1.0


@pytest.mark.parametrize("malformed", MALFORMED_ROUTES)
def test_malformed_router_reply_can_count_as_no(retriever, malformed: str) -> None:
    t = drive(make(retriever, max_turns=3, malformed_route="search"), [malformed, SEARCH_ORLA, YES, ANSWER])
    assert t.agents_asked() == ["rita", "sam", "rita", "ana"]
    assert t.outcome.info["malformed_verdicts"] == 1
    assert [turn.valid for turn in t.outcome.turns] == [False, True, True, True]


@pytest.mark.parametrize("failed", ["Orla Fenwick born", "<search>   </search>", "<search>Orla Fenwick"])
def test_invalid_search_retrieves_nothing_and_the_history_says_so(retriever, failed: str) -> None:
    t = drive(make(retriever), [NO, failed, YES, ANSWER])
    assert t.agents_asked() == ["rita", "sam", "rita", "ana"]
    next_prompt = request(t.asked[2])
    assert FAILED_SEARCH in next_prompt and "(1) " not in next_prompt
    info = t.outcome.info
    assert (info["searches"], info["failed_searches"], info["retrieved_ids"]) == (0, 1, [])
    assert t.outcome.turns[1].valid is False


def test_validity_is_recorded_per_turn_in_order(retriever) -> None:
    script = ["<VERIFY> No </Verify>", "<search>Orla</search>", "no idea", "query?", "Lunaria"]
    t = drive(make(retriever, max_turns=3, route_last_turn=False, malformed_route="search"), script)
    assert [(r.agent, r.text, r.valid) for r in t.outcome.turns] == [
        ("rita", script[0], True),
        ("sam", script[1], True),
        ("rita", script[2], False),
        ("sam", script[3], False),
        ("ana", script[4], False),
    ]
    assert t.outcome.reward == 0.0 and t.outcome.info["answered"] is False and t.outcome.final_answer == ""


# --- history cap -----------------------------------------------------------------------------------------------


def test_history_cap_drops_the_oldest_searches_whole(retriever) -> None:
    hits = retriever.search(["Brackwater country"], 3)[0]
    one_entry = HistoryEntry("Brackwater country", tuple(hit.passage for hit in hits))
    cap = len(one_entry.render()) + 10  # room for the newest search only
    t = drive(make(retriever, history_max_chars=cap), [NO, SEARCH_ORLA, NO, SEARCH_BRACKWATER, YES, ANSWER])
    answer_prompt = request(t.asked[-1])
    assert "Search: Brackwater country" in answer_prompt
    assert "Orla Fenwick born" not in answer_prompt
    assert one_entry.render() in answer_prompt  # whole, not cut


def test_render_history_keeps_the_newest_entries_that_fit_whole() -> None:
    entries = [HistoryEntry(f"query {i}", (PASSAGES[i],)) for i in range(3)]
    texts = [e.render() for e in entries]
    both_newest = texts[1] + "\n\n" + texts[2]
    assert render_history(entries, len(both_newest)) == both_newest
    assert render_history(entries, len(both_newest) - 1) == texts[2]
    assert render_history(entries, 10_000) == "\n\n".join(texts)
    assert render_history([], 100) == ""


def test_render_history_cuts_an_oversized_newest_entry_to_the_cap() -> None:
    entry = HistoryEntry("Orla", (PASSAGES[0],))
    shown = render_history([entry], 20)
    assert len(shown) == 20 and shown.endswith("...") and entry.render().startswith(shown[:-3])


def test_history_renders_failed_and_empty_searches() -> None:
    context = SearchContext()
    context.add_search(None)
    context.add_search("nothing matches", [])
    assert context.shown_history() == f"{FAILED_SEARCH}\n\nSearch: nothing matches\n(no passages found)"


# --- reward ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "metric", "reward"),
    [
        ("<answer>Lunaria</answer>", "em", 1.0),
        ("<answer>the republic of Lunaria.</answer>", "em", 1.0),  # an alias, after normalisation
        ("<answer>Lunaria city</answer>", "em", 0.0),
        ("<answer>Lunaria city</answer>", "f1", 2 / 3),  # best over golds: 'lunaria' vs 'lunaria city'
        ("<answer>Osterfell</answer>", "f1", 0.0),
        ("Lunaria", "f1", 0.0),  # no tag, no answer
    ],
)
def test_reward_grades_the_final_answer(retriever, answer: str, metric: str, reward: float) -> None:
    t = drive(make(retriever, reward_metric=metric), [YES, answer])
    assert t.outcome.reward == pytest.approx(reward)


def test_reward_uses_the_problem_answer_without_golden_answers(retriever) -> None:
    plain = Problem("q1", "Where was Orla Fenwick born?", "Brackwater")
    assert drive(make(retriever), [YES, "<answer>brackwater</answer>"], plain).outcome.reward == 1.0


# --- agents ----------------------------------------------------------------------------------------------------


def test_router_parse_tolerates_case_and_spaces_and_takes_the_last_tag() -> None:
    router = RouterAgent()
    assert router.parse("<verify>yes</verify>") == "yes"
    assert router.parse("hmm < Verify > NO < /verify >") == "no"
    assert router.parse("<verify>no</verify> wait <verify>yes</verify>") == "yes"
    assert router.parse("<verify>approve</verify>") is None
    assert router.parse("yes") is None


def test_searcher_and_answerer_parse() -> None:
    searcher, answerer = SearcherAgent(), AnswererAgent()
    assert searcher.parse("<search>a</search> then <SEARCH>  Orla \n Fenwick </search>") == "Orla Fenwick"
    assert searcher.parse("<search></search>") is None
    assert answerer.parse("so <Answer> Lunaria </answer>") == "Lunaria"
    assert not answerer.is_valid("<answer> </answer>")
    assert not answerer.is_valid("<answer>Lunaria")


def test_prompts_are_chat_messages_with_worked_examples_ending_with_the_request(retriever) -> None:
    turn = next(make(retriever).run(PROBLEM))
    roles = [m["role"] for m in turn.messages]
    assert roles[0] == "system" and roles[-1] == "user" and len(roles) >= 4
    assert roles[1:] == ["user", "assistant"] * ((len(roles) - 2) // 2) + ["user"]  # worked examples first
    assert request(turn).startswith(f"Question: {PROBLEM.question}")
    assert request(turn).endswith(RouterAgent.cue)
    for agent in (RouterAgent(), SearcherAgent(), AnswererAgent()):
        for _, reply in agent.demonstrations():
            assert agent.is_valid(reply), (agent.role, reply)


# --- construction and registries ------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["router", "searcher", "answerer"])
def test_missing_role_is_named(retriever, missing: str) -> None:
    roles = {role: name for role, name in ROLES.items() if role != missing}
    with pytest.raises(ValueError, match=missing):
        SearchOrchestra(SearchSettings(), roles, None, retriever)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"max_turns": 0}, r"system\.max_turns"),
        ({"history_max_chars": 0}, r"system\.history_max_chars"),
        ({"reward_metric": "bleu"}, r"system\.reward_metric"),
        ({"malformed_route": "yes"}, r"system\.malformed_route"),
        ({"topk": 0}, r"retrieval\.topk"),
    ],
)
def test_bad_settings_name_the_config_key(retriever, kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        make(retriever, **kwargs)


def test_missing_retriever_is_an_error() -> None:
    with pytest.raises(ValueError, match="retriever"):
        SearchOrchestra(SearchSettings(), ROLES, None, None)


def test_registries_find_orchestra_and_roles_by_name(retriever) -> None:
    assert ORCHESTRAS.get("search") is SearchOrchestra and SearchOrchestra.needs_retriever is True
    assert AGENT_ROLES.get("router") is RouterAgent
    assert AGENT_ROLES.get("searcher") is SearcherAgent
    assert AGENT_ROLES.get("answerer") is AnswererAgent
    assert make(retriever).agents == ("rita", "sam", "ana")


def test_assembly_builds_the_search_system_over_the_task_corpus(tmp_path: Path) -> None:
    from drmas.assembly import build_orchestra, build_task
    from drmas.config import read_config

    agents = "{r: {role: router, model: m}, s: {role: searcher, model: m}, a: {role: answerer, model: m}}"
    cfg = read_config(None, [
        "system.name=search", "task.name=multihop", "task.n_train=20", "task.n_test=5",
        "models={m: {builtin: tiny}}", f"agents={agents}", f"retrieval.index_dir={tmp_path}", "retrieval.topk=4",
    ])
    task = build_task(cfg)
    orchestra = build_orchestra(cfg, task)
    assert isinstance(orchestra, SearchOrchestra) and orchestra.agents == ("r", "s", "a")
    assert orchestra.topk == 4

    # A 2-hop question answered by hand: each hop's query (the subject's, then the bridge's name) brings
    # that hop's support passage from the generated world's corpus.
    problem = next(p for p in task.split("test") if p.meta["hops"] == 2)
    titles = {passage.id: passage.title for passage in task.passages()}
    first, second = problem.meta["support_ids"]
    script = [NO, f"<search>{titles[first]}</search>", NO, f"<search>{titles[second]}</search>", YES,
              f"<answer>{problem.answer}</answer>"]
    t = drive(orchestra, script, problem)
    assert len(t.outcome.info["retrieved_ids"]) == 8
    assert {first, second} <= set(t.outcome.info["retrieved_ids"])
    assert t.outcome.reward == 1.0


# --- end to end on a tiny model ----------------------------------------------------------------------------------


def test_episode_group_on_a_tiny_random_model_runs_all_three_agents(tiny_model, retriever) -> None:
    from drmas.engines.base import SamplingParams
    from drmas.engines.embedded import EmbeddedEngine
    from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeRunner

    model, tokenizer = tiny_model
    engine = EmbeddedEngine("tiny", model, tokenizer, max_batch_size=8, seed=0)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    specs = {name: AgentSpec("tiny", sampling) for name in ROLES.values()}
    orchestra = make(retriever, max_turns=3, route_last_turn=False, malformed_route="search")
    runner = EpisodeRunner(orchestra, {"tiny": engine}, specs, invalid_penalty=0.01, seed=0)
    results = runner.run([EpisodeRequest(f"e{i}", "g0", PROBLEM) for i in range(4)])

    # A random model writes no tags: every verdict is malformed (-> search, as configured), every search fails
    # (-> nothing retrieved), and the last turn goes to the answerer (router skipped there, as configured).
    for result in results:
        outcome = result.outcome
        assert [s.agent for s in result.samples] == ["rita", "sam", "rita", "sam", "ana"]
        assert [s.turn for s in result.samples] == [0, 1, 2, 3, 4]
        info = outcome.info
        assert (info["turns"], info["router_calls"], info["malformed_verdicts"]) == (3, 2, 2)
        assert (info["searches"], info["failed_searches"], info["retrieved_ids"]) == (0, 2, [])
        assert outcome.reward == 0.0 and info["answered"] is False
        for sample, turn in zip(result.samples, outcome.turns):
            assert sample.valid is turn.valid is False
            assert sample.reward == pytest.approx(-0.01) and sample.episode_reward == 0.0
            assert len(sample.behaviour_logprobs) == len(sample.response_ids) > 0
            assert all(math.isfinite(lp) and lp <= 0.0 for lp in sample.behaviour_logprobs)
            assert sample.group_id == "g0" and sample.policy_version == engine.version


class _CountingRetriever:
    """The real BM25 retriever, recording how many queries each `search` call carried."""

    def __init__(self, inner: BM25Retriever) -> None:
        self.inner = inner
        self.batches: list[int] = []

    def search(self, queries, topk):
        self.batches.append(len(queries))
        return self.inner.search(queries, topk)


class _RoleScriptedEngine:
    """Stands in for an LLM that always keeps searching: the agent is told apart by its max_new_tokens."""

    version = 0

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.replies = {11: NO, 12: SEARCH_ORLA, 13: ANSWER}

    def generate(self, prompts, params):
        from drmas.engines.base import Generation

        return [Generation([1], [-0.1], self.replies[p.max_new_tokens], "stop", 0) for p in params]


def test_runner_batches_the_searches_of_all_episodes_into_one_retriever_call(tiny_model, retriever) -> None:
    from drmas.engines.base import SamplingParams
    from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeRunner

    counting = _CountingRetriever(retriever)
    specs = {name: AgentSpec("m", SamplingParams(max_new_tokens=n)) for name, n in zip(ROLES.values(), (11, 12, 13))}
    runner = EpisodeRunner(make(counting, max_turns=3, route_last_turn=False),
                           {"m": _RoleScriptedEngine(tiny_model[1])}, specs, invalid_penalty=0.01, seed=0)
    results = runner.run([EpisodeRequest(f"e{i}", "g0", PROBLEM) for i in range(5)])
    assert counting.batches == [5, 5]  # two search turns, each one call for the five episodes
    for result in results:
        assert result.outcome.info["searches"] == 2 and result.outcome.info["retrieved_ids"][0] == "w0"
        assert result.outcome.reward == 1.0
