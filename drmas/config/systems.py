"""The settings of the built-in multi-agent systems (`system.*` when `system.name` is math, math_revise, search,
external).

Each is the `settings` its orchestra registers with (`drmas.mas.math`, `drmas.mas.revise`, `drmas.mas.search`,
`drmas.gateway.orchestra`);
they live here, with the other sections, so any process reads a built-in config without importing the
systems (see `drmas.config.sections`). The choices below are defined once: the checks and the orchestras
both use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from drmas.config.fields import help_field as _f
from drmas.config.sections import SYSTEM_SETTINGS, SystemSettings

VERDICTS = ("approve", "reject")  # system.malformed_verdict (math)
ROUTES = ("answer", "search")  # system.malformed_route (search)
QA_METRICS = ("em", "f1")  # system.reward_metric (search)
SAMPLING_SOURCES = ("config", "request")  # system.sampling (external)
# what drmas puts in the external program's environment (system.env may not set them)
PROGRAM_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "DRMAS_EPISODES_URL", "DRMAS_EPISODE_HEADER", "DRMAS_AGENTS",
                     "DRMAS_EPISODES_IN_FLIGHT")


@dataclass
class MathSettings(SystemSettings):
    """The math system: solver and verifier take turns for up to max_rounds rounds."""

    name: str = SystemSettings.name_field("math")
    max_rounds: int = _f(2, "Solver/verifier rounds K; the verifier is skipped in the last round.")
    malformed_verdict: str = _f(
        "approve", "How a verifier output without a <verify> verdict counts: approve (reference) or reject.")
    solver_prompts: str = _f(
        "solver", "The registered role agent (AGENT_ROLES) whose prompts and parsing the solver uses: a plugin's "
        "RoleAgent gives the solver worked examples of its own task without a new system (bench/lookup.py).")
    verifier_prompts: str = _f(
        "verifier", "The registered role agent whose prompts and parsing the verifier uses; its `parse` returns "
        "'approve' or 'reject'.")

    def problems(self, where: str) -> list[str]:
        return self.at_least(where, max_rounds=1) + self.one_of(where, "malformed_verdict", VERDICTS)


@dataclass
class ReviseSettings(SystemSettings):
    """The math_revise system: solver, task-graded check, reviser only after a wrong answer."""

    name: str = SystemSettings.name_field("math_revise")
    max_rounds: int = _f(2, "Attempts in all: 1 solver call + up to max_rounds - 1 reviser calls.")

    def problems(self, where: str) -> list[str]:
        return self.at_least(where, max_rounds=1)


@dataclass
class SearchSettings(SystemSettings):
    """The search system: router, searcher and answerer over a retriever (`retrieval.*`)."""

    name: str = SystemSettings.name_field("search")
    max_turns: int = _f(4, "Router-routed turns; the search agent is skipped on the last turn.")
    route_last_turn: bool = _f(
        True, "The router also routes the last turn, as in the reference: 'no' there ends the episode without an "
        "answer (reward 0). false: the last turn goes straight to the answerer (router skipped).")
    malformed_route: str = _f(
        "answer", "How a router output without a <verify>yes|no</verify> verdict counts: answer (as 'yes', "
        "reference) or search (as 'no'). It is an invalid turn (format penalty) either way.")
    history_max_chars: int = _f(2000, "Most characters of the query/passage history shown to the agents (the newest "
                                "are kept).")
    reward_metric: str = _f("em", "Task reward of the final answer, 'em' (exact match) or 'f1' (token F1).")

    def problems(self, where: str) -> list[str]:
        return (self.at_least(where, max_turns=1, history_max_chars=1) + self.one_of(where, "malformed_route", ROUTES)
                + self.one_of(where, "reward_metric", QA_METRICS))


@dataclass
class ExternalSettings(SystemSettings):
    """The external system: an agent program of your own, started per rollout, calls the rollout's
    OpenAI-compatible gateway; every call is a sample of the agent its `model` names (see docs/gateway.md)."""

    name: str = SystemSettings.name_field("external")
    command: list[str] = _f(
        [], "The agent program, as an argument list (e.g. [python, agents.py]); started by every rollout (and by "
        "evaluation) with OPENAI_BASE_URL, OPENAI_API_KEY and DRMAS_EPISODES_URL (and DRMAS_EPISODE_HEADER, "
        "DRMAS_AGENTS, DRMAS_EPISODES_IN_FLIGHT) in its environment, restarted when it exits (docs/gateway.md). A "
        "first word `python` runs the Python drmas runs on.")
    workdir: str = _f("", "Working directory of the program (relative: to drmas' working directory; empty: drmas').")
    env: dict[str, str] = _f(dict, "Environment variables set for the program, over drmas' own environment.")
    host: str = _f(
        "127.0.0.1", "Address the gateway binds. Loopback: only this machine can call it. Any other address needs "
        "every request to carry the run's bearer token (OPENAI_API_KEY of the program).")
    port: int = _f(0, "Port of the gateway (0: a free one; a fixed port serves one rollout per machine).")
    sampling: str = _f(
        "config", "Whose sampling a call uses: 'config' (the agent's temperature / top_p and drmas' per-call seeds; "
        "the request's are ignored, so training explores and evaluation samples as configured) or 'request' (a "
        "request's temperature, top_p and seed replace the agent's). max_tokens (capped by the agent's "
        "max_new_tokens) and stop strings are taken from the request either way.")
    episode_timeout_s: float = _f(
        600.0, "An episode the program claimed and did not end (no reward reported) within this many seconds is "
        "dropped, with its GRPO group, like any incomplete group; so is one no program claimed in that time.")
    claim_wait_s: float = _f(
        20.0, "How long POST /drmas/v1/episodes waits for an episode to hand out (admission follows the staleness "
        "bound and the buffer) before answering 503 with Retry-After.")
    batch_wait_s: float = _f(
        0.2, "When no engine has work, how long the rollout waits for the next calls of the episodes it has just "
        "answered (or opened), so they start in one batch instead of trickling in.")
    max_request_kb: int = _f(4096, "Largest request body the gateway accepts, in KiB (larger: 413).")
    tool_parser: str = _f(
        "hermes", "How the gateway finds tool calls in a reply to a request that offered tools (a registered tool "
        "parser; built in: hermes, <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> blocks, the format "
        "of Qwen2.5/3, Hermes and SmolLM3 templates and of the one drmas writes for a template that knows no tools). "
        "See docs/gateway.md.")
    max_restarts: int = _f(
        3, "Restarts of a program that exited before the rollout gives up (its episodes in flight are dropped at "
        "each exit); past it the rollout ends with an error, which its launcher may restart. Exit code 2 (a bad "
        "command line) is not restarted.")
    restart_backoff_s: float = _f(1.0, "Wait before restarting the program the first time; doubled for each "
                                  "later restart.")
    max_restart_backoff_s: float = _f(30.0, "Longest wait before a restart of the program.")
    stop_timeout_s: float = _f(
        10.0, "When the rollout ends, how long the program's process group has after SIGTERM before SIGKILL.")

    def problems(self, where: str) -> list[str]:
        found = self.one_of(where, "sampling", SAMPLING_SOURCES)
        if not self.command or not all(isinstance(arg, str) and arg for arg in self.command):
            found.append(f"{where}.command: the agent program to run, a list of non-empty strings (e.g. "
                         f"[python, agents.py]); got {self.command!r}")
        if not self.host:
            found.append(f"{where}.host: an address to bind (127.0.0.1: this machine only)")
        found += [f"{where}.env.{key}: set by drmas for the program (it names the gateway); remove it"
                  for key in self.env if key in PROGRAM_VARIABLES]
        if not 0 <= self.port <= 65535:
            found.append(f"{where}.port: must be 0 (a free port) to 65535, got {self.port}")
        for key in ("episode_timeout_s", "claim_wait_s", "stop_timeout_s"):
            if getattr(self, key) <= 0:
                found.append(f"{where}.{key}: must be > 0, got {getattr(self, key)}")
        if self.restart_backoff_s < 0 or self.max_restart_backoff_s < self.restart_backoff_s:
            found.append(f"{where}: needs 0 <= restart_backoff_s <= max_restart_backoff_s, got "
                         f"{self.restart_backoff_s} and {self.max_restart_backoff_s}")
        return found + self.at_least(where, batch_wait_s=0.0, max_request_kb=1, max_restarts=0)


for _name, _cls in (("math", MathSettings), ("math_revise", ReviseSettings), ("search", SearchSettings),
                    ("external", ExternalSettings)):
    SYSTEM_SETTINGS.adopt(_name, _cls)
