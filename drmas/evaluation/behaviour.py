"""Per-agent behaviour statistics over evaluation episodes.

A score alone does not say *how* a multi-agent system got it: whether the verifier ever rejects, whether
the search agent searches at all, whether an agent's outputs keep failing the format. This module turns
episode outcomes into those numbers, generically: per agent the calls per episode and the share of valid
calls, and per numeric counter an orchestra reports in `EpisodeOutcome.info` (math: `rounds`,
`verifier_calls`, `approved`; search: `searches`, ...) its mean per episode. Booleans count as 0/1, so
`approved` becomes the approval rate. Non-numeric info values are ignored. The same means over the failed
episodes alone (`info_on_failures`) say what the system did when its answer was wrong: `approved` there is
how often the verifier let a wrong answer through.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from drmas.episodes.tally import is_number
from drmas.evaluation.passk import SUCCESS_TOLERANCE
from drmas.mas.base import EpisodeOutcome


def behaviour_stats(outcomes: Sequence[EpisodeOutcome], agents: Iterable[str] = ()) -> dict:
    """Statistics of `outcomes` (the episodes of one benchmark).

    Returns ``{"episodes": N, "agents": {agent: {"calls_per_episode", "valid_share", "calls",
    "mean_response_chars"}}, "info": {key: mean per episode}, "info_on_failures": {key: mean per failed
    episode}}`` (failed: reward below an exact match, `drmas.evaluation.passk.SUCCESS_TOLERANCE`). `agents` lists agents to report even when
    they never spoke (calls 0, valid_share None); agents seen in the turns are always reported. An info key
    is averaged over the episodes that report it.
    """
    n = len(outcomes)
    calls: dict[str, int] = {name: 0 for name in agents}
    valid: dict[str, int] = {name: 0 for name in agents}
    chars: dict[str, int] = {name: 0 for name in agents}
    info_sums: dict[str, float] = {}
    info_counts: dict[str, int] = {}
    fail_sums: dict[str, float] = {}
    fail_counts: dict[str, int] = {}
    for outcome in outcomes:
        failed = float(outcome.reward) < 1.0 - SUCCESS_TOLERANCE
        for turn in outcome.turns:
            calls[turn.agent] = calls.get(turn.agent, 0) + 1
            valid[turn.agent] = valid.get(turn.agent, 0) + int(bool(turn.valid))
            chars[turn.agent] = chars.get(turn.agent, 0) + len(turn.text)
        for key, value in outcome.info.items():
            if is_number(value):
                info_sums[key] = info_sums.get(key, 0.0) + float(value)
                info_counts[key] = info_counts.get(key, 0) + 1
                if failed:
                    fail_sums[key] = fail_sums.get(key, 0.0) + float(value)
                    fail_counts[key] = fail_counts.get(key, 0) + 1
    per_agent = {
        name: {
            "calls_per_episode": calls[name] / n if n else 0.0,
            "valid_share": valid[name] / calls[name] if calls[name] else None,
            "calls": calls[name],
            "mean_response_chars": chars[name] / calls[name] if calls[name] else None,
        }
        for name in calls
    }
    info = {key: info_sums[key] / info_counts[key] for key in info_sums}
    on_failures = {key: fail_sums[key] / fail_counts[key] for key in fail_sums}
    return {"episodes": n, "agents": per_agent, "info": info, "info_on_failures": on_failures}

