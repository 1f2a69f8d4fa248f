"""The gateway's HTTP API as an ASGI app (Starlette); `drmas.gateway.service` serves it.

    GET  /v1/models                              the agents, as OpenAI models
    GET  /v1/models/{agent}
    POST /v1/chat/completions                    a call of the agent `model` names, in the episode named by the
                                                 X-Drmas-Episode header or the `user` field -> chat.completion
                                                 (its id also in the X-Drmas-Completion-Id and X-Request-Id
                                                 headers, see `completion_headers`); `stream`: its chunks
    POST /v1/responses                           the same as a Responses API call -> response (`responses_api`)
    POST /drmas/v1/episodes                      hand out an episode: {"id", "object": "episode", "problem"}
    POST /drmas/v1/episodes/{id}/reward          end it: {"reward"} or {"answer"}, optionally "agent_rewards",
                                                 "call_rewards" -> {"id", "object", "status", "reward", "calls"}

Handlers never block the event loop: a call is queued in the `Inbox` and its future awaited while the rollout's
driver generates it. With `require_token` every request must carry `Authorization: Bearer <token>` (checked
before the body is read); bodies are bounded (`max_body_bytes`). Every refusal, a routing error or an unexpected
failure included, is OpenAI's error object with its status, never a traceback, and nothing a request does ends
the rollout.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from dataclasses import dataclass
from functools import wraps
from http import HTTPStatus
from typing import Awaitable, Callable, Mapping, Optional

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from drmas.gateway import openai_api as api
from drmas.gateway import responses_api, sse
from drmas.gateway.inbox import Call, End, Inbox
from drmas.core.tool_calls import ToolGrammar, ToolParser
from drmas.runtime.http import RequestError, read_body

log = logging.getLogger(__name__)

EPISODE_HEADER = "X-Drmas-Episode"
COMPLETION_HEADER = "X-Drmas-Completion-Id"
_CLAIM_POLL_S = 1.0  # a waiting claim checks this often whether its client is still there


@dataclass(frozen=True)
class AppSettings:
    agents: Mapping[str, str]  # agent -> model id: the `model` of a call names the agent
    token: str  # the run's bearer token
    require_token: bool  # the gateway listens beyond this machine
    max_body_bytes: int
    honour_sampling: bool  # system.sampling == "request"
    claim_wait_s: float
    tool_parser: Optional[ToolParser] = None  # system.tool_parser: a reply's text -> content and tool calls
    tool_grammar: Optional[ToolGrammar] = None  # the grammar of its calls, for a forced tool_choice (None: refused)
    parser_name: str = "hermes"


def build_app(inbox: Inbox, settings: AppSettings) -> Starlette:
    agents = list(settings.agents)
    stored = responses_api.ResponseStore()

    def guarded(handler: Callable[[Request], Awaitable[dict | Response]]) -> Callable[[Request], Awaitable[Response]]:
        @wraps(handler)
        async def run(request: Request) -> Response:
            try:
                _authorize(request, settings)
                answer = await handler(request)
                return answer if isinstance(answer, Response) else _json(HTTPStatus.OK, answer)
            except api.ApiError as exc:
                return _error(exc)
            except RequestError as exc:
                return _error(api.ApiError(exc.status, str(exc)))
            except ClientDisconnect:  # nobody to answer: a debug line, not an error
                log.debug("a client disconnected before its request was complete")
                return Response(status_code=HTTPStatus.BAD_REQUEST)
            except Exception:
                log.exception("the gateway failed on %s %s", request.method, request.url.path)
                return _error(api.ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error of the drmas gateway "
                                           "(see the rollout's log)", type="server_error"))
        return run

    async def body(request: Request) -> bytes:
        return await read_body(request, settings.max_body_bytes)

    @guarded
    async def list_models(request: Request) -> dict:
        return api.models(agents)

    @guarded
    async def get_model(request: Request) -> dict:
        agent = request.path_params["agent"]
        api.check_model(agent, agents)
        return api.model(agent)

    async def generate(episode_id: str, call_id: str, call: api.ChatCall) -> list:
        """Queue the call in its episode and await its replies (one per choice)."""
        event = Call(call_id, call)
        inbox.submit(episode_id, event)
        return await asyncio.wrap_future(event.future)

    @guarded
    async def chat(request: Request) -> Response:
        call = api.decode_chat(await body(request), agents, settings.honour_sampling, settings.tool_grammar,
                               settings.parser_name)
        episode_id = _episode(request, call.user)
        completion_id = api.new_completion_id()
        replies = await generate(episode_id, completion_id, call)
        answer = api.completion(completion_id, call, replies, settings.agents[call.agent], settings.tool_parser)
        if call.stream:
            return sse.stream_chat(answer, call.stream_usage, completion_headers(completion_id))
        return _json(HTTPStatus.OK, answer, completion_headers(completion_id))

    @guarded
    async def responses(request: Request) -> Response:
        req = responses_api.decode_responses(await body(request), agents)
        episode_id = _episode(request, req.user)
        given = responses_api.prepare(req, episode_id, stored, settings.honour_sampling, settings.tool_grammar,
                                      settings.parser_name)
        response_id = responses_api.new_response_id()
        replies = await generate(episode_id, response_id, given.call)
        answer, assistant = responses_api.response(response_id, given, replies[0], settings.agents[given.call.agent],
                                                   settings.tool_parser)
        if given.store:
            stored.put(response_id, episode_id, given.history + [assistant])
        if given.call.stream:
            return sse.stream_response(answer, completion_headers(response_id))
        return _json(HTTPStatus.OK, answer, completion_headers(response_id))

    @guarded
    async def claim(request: Request) -> dict:
        api.decode_claim(await body(request))
        future = inbox.claim()
        wrapped = asyncio.wrap_future(future)
        deadline = asyncio.get_running_loop().time() + settings.claim_wait_s
        while not wrapped.done() and asyncio.get_running_loop().time() < deadline:
            await asyncio.wait({wrapped}, timeout=min(_CLAIM_POLL_S, deadline - asyncio.get_running_loop().time()))
            if not wrapped.done() and await request.is_disconnected() and future.cancel():
                return {}  # nobody to hand it to: the episode stays for the next claim
        if not wrapped.done() and future.cancel():
            raise api.ApiError(HTTPStatus.SERVICE_UNAVAILABLE, f"no episode to hand out within "
                               f"system.claim_wait_s={settings.claim_wait_s:g} s (new ones are admitted as the "
                               "staleness bound and the trajectory buffer allow); retry", type="server_error",
                               code="no_episode", headers={"Retry-After": "1"})
        return (await wrapped).payload()

    @guarded
    async def reward(request: Request) -> dict:
        event = End(api.decode_reward(await body(request)))
        inbox.submit(request.path_params["episode"], event)
        return await asyncio.wrap_future(event.future)

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{agent:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/drmas/v1/episodes", claim, methods=["POST"]),
        Route("/drmas/v1/episodes/{episode}/reward", reward, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _routing_error})
    app.router.redirect_slashes = False
    return app


def _episode(request: Request, user: str | None) -> str:
    episode_id = request.headers.get(EPISODE_HEADER) or user
    if not episode_id:
        raise api.bad_request(f"name the episode of this call: the {EPISODE_HEADER} header or the `user` field, "
                              "with the id POST /drmas/v1/episodes gave", "user", "missing_episode")
    return episode_id


def completion_headers(completion_id: str) -> dict[str, str]:
    """A completion's id in headers too, for programs whose framework does not hand the body's `id` on: the
    openai client records X-Request-Id as the result's `_request_id` (and the Agents SDK's chat model as
    `ModelResponse.request_id`); X-Drmas-Completion-Id names it for an HTTP client's response hook."""
    return {COMPLETION_HEADER: completion_id, "X-Request-Id": completion_id}


def _authorize(request: Request, settings: AppSettings) -> None:
    if not settings.require_token:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), settings.token.encode()):
        raise api.ApiError(HTTPStatus.UNAUTHORIZED, "Incorrect API key provided: this gateway listens beyond this "
                           "machine and takes only the run's key (OPENAI_API_KEY of the program drmas started)",
                           code="invalid_api_key")


async def _routing_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405 as OpenAI error objects, like every other refusal."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == HTTPStatus.NOT_FOUND:
        message = (f"no such path: {request.url.path} (paths: /v1/chat/completions, /v1/responses, /v1/models, "
                   "/drmas/v1/episodes, /drmas/v1/episodes/{id}/reward)")
    else:
        message = f"{request.method} is not allowed on {request.url.path}"
    return _error(api.ApiError(exc.status_code, message, headers=exc.headers))


def _error(exc: api.ApiError) -> Response:
    return _json(exc.status, exc.payload(), exc.headers)


def _json(status: int, payload: dict, headers: Mapping[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(payload), status_code=status, headers=dict(headers or {}),
                    media_type="application/json")
