"""What an agent program sees of the gateway beyond the API: the environment drmas starts it with (tracing that
would send the run's token to a framework's vendor turned off) and where it finds a completion's id (the body's
`id`, and the X-Drmas-Completion-Id and X-Request-Id headers, which the real `openai` client exposes). No engine:
the test drives the orchestra by hand (tests/gateway_by_hand.py)."""

from __future__ import annotations

import gateway_by_hand as by_hand
import pytest

from drmas.gateway.service import OPT_IN_TRACING, program_environment
from drmas.mas.base import Reply

pytestmark = pytest.mark.timeout(120)

URL = "http://127.0.0.1:4321"


def _env(inherited: dict, extra: dict | None = None) -> dict:
    return program_environment(inherited, extra or {}, URL, "the-token", ["solver", "verifier"], 8)


def test_tracing_that_would_export_the_token_is_off_unless_the_run_turns_it_on():
    """The Agents SDK's tracing (on by default; it exports with OPENAI_API_KEY, here the run's token, to OpenAI)
    is off, even if drmas' own environment, set up for the user's real key, turns it on; system.env, the run's
    own choice, can turn it on. LangSmith tracing (opt-in, its own key) is left as the user set it anywhere, and
    set to false when unset."""
    env = _env({"OPENAI_AGENTS_DISABLE_TRACING": "0", "HOME": "/home/u"})
    assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "1" and env["HOME"] == "/home/u"
    assert env["LANGSMITH_TRACING"] == env["LANGCHAIN_TRACING_V2"] == "false"
    assert env["OPENAI_API_KEY"] == "the-token" and env["OPENAI_BASE_URL"] == f"{URL}/v1"
    assert _env({}, {"OPENAI_AGENTS_DISABLE_TRACING": "0"})["OPENAI_AGENTS_DISABLE_TRACING"] == "0"
    for key in OPT_IN_TRACING:  # any of LangSmith's switches set: none is touched
        for inherited, extra in (({key: "true"}, {}), ({}, {key: "true"})):
            env = _env(inherited, extra)
            assert env[key] == "true" and all(k not in env for k in OPT_IN_TRACING if k != key), (key, env)


def test_the_started_program_gets_that_environment():
    orchestra = by_hand.build("system.env={LANGSMITH_TRACING: 'true'}")
    try:
        by_hand.Episode(orchestra)
        env = orchestra.program.env
        assert env["OPENAI_AGENTS_DISABLE_TRACING"] == "1" and env["LANGSMITH_TRACING"] == "true"
        assert "LANGCHAIN_TRACING_V2" not in env or env["LANGCHAIN_TRACING_V2"] != "false"
        assert env["OPENAI_API_KEY"] == orchestra.service.token
    finally:
        by_hand.close_within(orchestra, 60)


def test_a_completion_id_is_in_its_body_and_headers():
    """The chat.completion's `id` (what call_rewards and invalid_calls name) is also in X-Drmas-Completion-Id
    and X-Request-Id: the openai client's `_request_id`, which the Agents SDK's chat model keeps as
    `ModelResponse.request_id` while its `response_id` is None."""
    orchestra = by_hand.build()
    try:
        episode = by_hand.Episode(orchestra)
        got, caller = episode.call_in_thread(
            lambda client, eid: client.chat.completions.with_raw_response.create(
                model="solver", user=eid, messages=[{"role": "user", "content": "hi"}]))
        episode.take_call()
        episode.generator.send(Reply("4", 3, 1, "stop", 0))  # the driver's reply: the call is answered
        caller.join(30)
        raw = got["reply"]
        completion = raw.parse()
        assert completion.id.startswith("chatcmpl-") and completion.choices[0].message.content == "4"
        assert raw.headers["x-drmas-completion-id"] == raw.headers["x-request-id"] == completion.id
        assert completion._request_id == completion.id
    finally:
        by_hand.close_within(orchestra, 60)
