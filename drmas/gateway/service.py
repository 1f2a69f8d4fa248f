"""The gateway of one rollout: its HTTP app served on a thread of its own, its bearer token, and the environment
that tells an agent program where to find it.

The HTTP server runs its own event loop on a daemon thread (`drmas.runtime.http.HttpService`, the hardened
uvicorn service the retrieval server uses); the engines stay with the rollout's driver thread, which the
handlers reach only through the `Inbox`. The token is generated per gateway (a fresh one every run), never
written to a config or a log, and handed to the program as OPENAI_API_KEY. On a loopback address only this
machine can connect and the token is not checked; on any other address every request must carry it.
"""

from __future__ import annotations

import os
import secrets
from typing import Mapping

from drmas.config.systems import PROGRAM_VARIABLES, ExternalSettings
from drmas.gateway.app import EPISODE_HEADER, AppSettings, build_app
from drmas.gateway.inbox import Inbox
from drmas.core.tool_calls import TOOL_PARSERS
from drmas.runtime.http import HttpService
from drmas.runtime.netsec import is_loopback_host

_WILDCARDS = ("0.0.0.0", "::", "")


class GatewayService:
    def __init__(self, inbox: Inbox, settings: ExternalSettings, agents: Mapping[str, str]) -> None:
        """`agents`: agent name -> model id (the models the gateway lists)."""
        self.token = secrets.token_urlsafe(32)
        self.require_token = not is_loopback_host(settings.host)
        app = build_app(inbox, AppSettings(
            agents=dict(agents), token=self.token, require_token=self.require_token,
            max_body_bytes=settings.max_request_kb * 1024, honour_sampling=settings.sampling == "request",
            claim_wait_s=settings.claim_wait_s, tool_parser=TOOL_PARSERS.lookup(settings.tool_parser, "system.tool_parser")))
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
        """The program's environment: drmas' own, then `extra` (system.env), then where the gateway is."""
        env = {**os.environ, **extra}
        host = self.url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
        no_proxy = [p for p in env.get("NO_PROXY", env.get("no_proxy", "")).split(",") if p]
        env["NO_PROXY"] = env["no_proxy"] = ",".join(dict.fromkeys([*no_proxy, host, "127.0.0.1", "localhost"]))
        values = (f"{self.url}/v1", self.token, f"{self.url}/drmas/v1/episodes", EPISODE_HEADER, ",".join(self._agents),
                  str(in_flight))
        env.update(zip(PROGRAM_VARIABLES, values))
        return env

    def close(self) -> None:
        self._http.close()
