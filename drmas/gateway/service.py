"""The gateway of one rollout: its HTTP app served on a thread of its own, its bearer token, and the environment
that tells an agent program where to find it.

The HTTP server runs its own event loop on a daemon thread (`drmas.runtime.http.HttpService`, the hardened
uvicorn service the retrieval server uses); the engines stay with the rollout's driver thread, which the
handlers reach only through the `Inbox`. The token is generated per gateway (a fresh one every run), never
written to a config or a log, and handed to the program as OPENAI_API_KEY. On a loopback address only this
machine can connect and the token is not checked; on any other address every request must carry it.

The program's environment turns off the tracing of agent frameworks that would send that token elsewhere
(`TRACING_OFF`, see `program_environment`).
"""

from __future__ import annotations

import os
import secrets
from typing import Mapping, Sequence

from drmas.config.systems import PROGRAM_VARIABLES, ExternalSettings
from drmas.gateway.app import EPISODE_HEADER, AppSettings, build_app
from drmas.gateway.inbox import Inbox
from drmas.core.tool_calls import TOOL_CALL_GRAMMARS, TOOL_PARSERS
from drmas.runtime.http import HttpService
from drmas.runtime.netsec import is_loopback_host

_WILDCARDS = ("0.0.0.0", "::", "")

# Tracing on by default that exports with OPENAI_API_KEY (here the run's token) to its vendor: the OpenAI Agents
# SDK (Python and JS) posts every run's spans, prompts and replies included, to OpenAI's servers. Off, unless
# system.env sets it (drmas' own environment was set for the user's real key, so it does not count).
TRACING_OFF = {"OPENAI_AGENTS_DISABLE_TRACING": "1"}
# Opt-in tracing (LangSmith: LangChain, LangGraph), exported with its own key: left as the user set it, in
# drmas' environment or system.env; set to false when unset, so a program's .env (python-dotenv does not
# override what is set) cannot trace every training call unless the run asks for it.
OPT_IN_TRACING = ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING")
OPT_IN_OFF = {"LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false"}


def program_environment(inherited: Mapping[str, str], extra: Mapping[str, str], url: str, token: str,
                        agents: Sequence[str], in_flight: int) -> dict[str, str]:
    """The program's environment: `inherited` (drmas' own) with tracing that would export the token turned off,
    then `extra` (system.env), then where the gateway is (PROGRAM_VARIABLES)."""
    env = {**inherited, **TRACING_OFF, **extra}
    if not any(env.get(key) for key in OPT_IN_TRACING):
        env.update(OPT_IN_OFF)
    host = url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
    no_proxy = [p for p in env.get("NO_PROXY", env.get("no_proxy", "")).split(",") if p]
    env["NO_PROXY"] = env["no_proxy"] = ",".join(dict.fromkeys([*no_proxy, host, "127.0.0.1", "localhost"]))
    values = (f"{url}/v1", token, f"{url}/drmas/v1/episodes", EPISODE_HEADER, ",".join(agents), str(in_flight))
    env.update(zip(PROGRAM_VARIABLES, values))
    return env


class GatewayService:
    def __init__(self, inbox: Inbox, settings: ExternalSettings, agents: Mapping[str, str]) -> None:
        """`agents`: agent name -> model id (the models the gateway lists)."""
        self.token = secrets.token_urlsafe(32)
        self.require_token = not is_loopback_host(settings.host)
        app = build_app(inbox, AppSettings(
            agents=dict(agents), token=self.token, require_token=self.require_token,
            max_body_bytes=settings.max_request_kb * 1024, honour_sampling=settings.sampling == "request",
            claim_wait_s=settings.claim_wait_s, tool_parser=TOOL_PARSERS.lookup(settings.tool_parser, "system.tool_parser"),
            tool_grammar=TOOL_CALL_GRAMMARS.get(settings.tool_parser) if settings.tool_parser in TOOL_CALL_GRAMMARS
            else None, parser_name=settings.tool_parser))
        self._http = HttpService(app, settings.host, settings.port, "drmas gateway")
        self._agents = list(agents)

    def start(self) -> "GatewayService":
        self._http.start()
        return self

    @property
    def url(self) -> str:
        """Where a program on this machine reaches the gateway (loopback for a wildcard bind)."""
        host, _ = self._http.address
        return self._http.base_url("127.0.0.1" if host in _WILDCARDS else None)

    def program_env(self, in_flight: int, extra: Mapping[str, str]) -> dict[str, str]:
        """The program's environment (`program_environment`), from drmas' own and `extra` (system.env)."""
        return program_environment(os.environ, extra, self.url, self.token, self._agents, in_flight)

    def close(self) -> None:
        self._http.close()
