"""The gateway's stop: every request the rollout's driver has taken is answered when the rollout stops, and the
gateway's server stops within seconds (a handler left awaiting an answer that never comes kept uvicorn waiting for
its "background tasks" for good, and the launcher killed the rollout after a minute). No engine: the tests drive
the external orchestra's episode generator by hand, as the runner does, or its `Inbox` alone. The async pipeline's
stop, through the launcher: tests/test_gateway_pipeline.py."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

import gateway_by_hand as by_hand
import httpx
import openai
import pytest

from drmas.gateway.inbox import Call, Dropped, End, Inbox
from drmas.gateway.openai_api import ApiError, ChatCall, RewardRequest
from drmas.tasks.base import Problem

STOPPED_WITHIN_S = 10.0  # the server's shutdown grace is 5 s; a gateway with nothing left to answer needs far less

pytestmark = pytest.mark.timeout(120)


# ---- the inbox alone ---------------------------------------------------------------------------------------


def _call(episode_id: str) -> Call:
    request = ChatCall(agent="solver", messages=[{"role": "user", "content": "hi"}], sampling={}, stop=(), n=1,
                       user=episode_id)
    return Call("chatcmpl-test", request)


def _claimed(inbox: Inbox) -> str:
    claim = inbox.claim()
    episode_id = inbox.open(Problem("p0", "What is 2 + 2?", "4"))
    assert claim.result(0).episode_id == episode_id
    return episode_id


def _status(future: Future) -> int:
    error = future.exception(0)
    assert isinstance(error, ApiError), error
    return error.status


def test_close_answers_the_call_the_driver_took_and_the_queued_ones():
    """The driver took a call (it generates it) and another waits behind it: closing answers both with 503, and
    the driver's late answer changes nothing (the program was told already)."""
    inbox = Inbox(episode_timeout_s=60, batch_wait_s=0)
    episode_id = _claimed(inbox)
    taken, queued = _call(episode_id), End(RewardRequest(reward=1.0))
    inbox.submit(episode_id, taken)
    inbox.submit(episode_id, queued)
    assert inbox.next_events([episode_id]) == [taken]
    inbox.close("the rollout is stopping")
    assert _status(taken.future) == _status(queued.future) == 503
    assert "the rollout is stopping" in str(taken.future.exception(0))
    inbox.answer(episode_id, taken, ["too late"])  # no error, no change
    assert _status(taken.future) == 503
    assert inbox.next_events([episode_id]) == [Dropped("the rollout is stopping")]  # the driver lets it go
    with pytest.raises(ApiError) as refused:
        inbox.submit(episode_id, _call(episode_id))
    assert refused.value.status == 503


def test_a_forgotten_episode_answers_its_taken_call_and_is_gone():
    """An episode the driver abandons (its generator closed: the runner dropped it past its deadline, or stopped)
    answers the call it had taken with 410 and is forgotten: later requests naming it get 410 too."""
    inbox = Inbox(episode_timeout_s=60, batch_wait_s=0)
    episode_id = _claimed(inbox)
    taken = _call(episode_id)
    inbox.submit(episode_id, taken)
    assert inbox.next_events([episode_id]) == [taken]
    assert inbox.forget(episode_id, "was abandoned by the rollout") == 1
    assert _status(taken.future) == 410 and "was abandoned by the rollout" in str(taken.future.exception(0))
    with pytest.raises(ApiError) as refused:
        inbox.submit(episode_id, _call(episode_id))
    assert refused.value.status == 410


# ---- the orchestra and its gateway, over HTTP --------------------------------------------------------------


@pytest.fixture
def orchestra():
    built = by_hand.build()
    yield built
    by_hand.close_within(built, 120)  # whatever the test left


def test_a_call_in_flight_when_the_rollout_stops_gets_503_and_the_gateway_stops_at_once(orchestra):
    """The rollout stops mid-episode (the runner abandons its live episodes and closes the orchestra) while the
    driver generates a program's call: the program gets 503 "the rollout is stopping", and the gateway stops in
    seconds instead of waiting for an answer that will never come."""
    episode = by_hand.Episode(orchestra)
    got, caller = episode.call_in_thread(by_hand.ask_solver)
    episode.take_call()
    took = by_hand.close_within(orchestra, 60)
    caller.join(10)
    assert took < STOPPED_WITHIN_S, took
    error = got.get("error")
    assert isinstance(error, openai.APIStatusError) and error.status_code == 503, got
    assert "the rollout is stopping" in error.message


@pytest.mark.parametrize("let_go", ["closed", "released"])
def test_an_episode_the_runner_lets_go_answers_its_call_in_flight(orchestra, let_go):
    """The runner drops a live episode past its bounds by closing its generator, and abandons the live ones when
    its stream stops by releasing them (the generator is closed when collected): either way the call it had
    taken is answered with 410 at once, and the gateway serves on."""
    episode = by_hand.Episode(orchestra)
    got, caller = episode.call_in_thread(by_hand.ask_solver)
    episode.take_call()
    if let_go == "closed":
        episode.generator.close()
    else:
        episode.generator = None
    caller.join(10)
    error = got.get("error")
    assert isinstance(error, openai.APIStatusError) and error.status_code == 410, got
    assert "was abandoned by the rollout" in error.message
    assert [m.id for m in episode.client.models.list().data] == ["solver", "verifier"]  # still serving
    assert by_hand.close_within(orchestra, 60) < STOPPED_WITHIN_S


def test_the_server_stops_even_with_a_handler_that_never_returns():
    """The bound under the gateway's answers: a handler still awaiting after the shutdown grace (its connection
    dropped) is cancelled one more grace later, so a server's stop never waits for good."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    from drmas.runtime.http import HttpService

    async def forever(request):
        await asyncio.Event().wait()

    service = HttpService(Starlette(routes=[Route("/", forever)]), "127.0.0.1", 0, "test server",
                          shutdown_grace_s=0.5).start()
    got: dict = {}

    def call() -> None:
        try:
            got["answer"] = httpx.get(service.base_url(), timeout=60)
        except httpx.HTTPError as exc:
            got["error"] = exc

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    time.sleep(0.3)  # the request is in its handler
    start = time.monotonic()
    closer = threading.Thread(target=service.close, daemon=True)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "the server waited for its handler"
    assert time.monotonic() - start < 5
    caller.join(10)
    assert isinstance(got.get("error"), httpx.RemoteProtocolError), got  # dropped: there was no answer to give
