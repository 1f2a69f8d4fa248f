"""Services (what an orchestra's episodes call, batched by the driver) used to be called tools; the old names keep
working for one release, each with a DeprecationWarning that names the new one: `drmas.api`'s `Tool`, `ToolCall`,
`SandboxTool`, `AssertTool`, `ServiceCall`'s `tool` field, and an orchestra's `tools` mapping."""

from __future__ import annotations

import warnings

import pytest
from test_episodes import LookUpTwice, RecordingService, ScriptedEngine, TwoTurns, _requests

import drmas.api
from drmas.engines.base import SamplingParams
from drmas.episodes import AgentSpec, EpisodeRunner
from drmas.mas.base import ServiceCall


@pytest.mark.parametrize("old, new", [("Tool", "Service"), ("ToolCall", "ServiceCall"),
                                      ("SandboxTool", "SandboxService"), ("AssertTool", "AssertService")])
def test_the_old_names_resolve_to_the_new_ones_with_a_warning(old, new):
    with pytest.warns(DeprecationWarning, match=rf"drmas\.api\.{old} is deprecated: use drmas\.api\.{new}"):
        assert getattr(drmas.api, old) is getattr(drmas.api, new)
    with pytest.warns(DeprecationWarning, match=rf"use drmas\.api\.{new}"):
        exec(f"from drmas.api import {old}", {})
    assert old not in drmas.api.__all__ and new in drmas.api.__all__


def test_the_new_names_and_unknown_ones_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from drmas.api import AssertService, SandboxService, Service, ServiceCall  # noqa: F401
        with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
            drmas.api.Nothing


def test_a_service_call_takes_the_old_field_keyword_with_a_warning():
    with pytest.warns(DeprecationWarning, match="ServiceCall\\(tool=...\\) is deprecated"):
        call = drmas.api.ServiceCall(tool="calc", request=[1, 2])
    assert call == ServiceCall("calc", [1, 2]) == ServiceCall(service="calc", request=[1, 2])
    with pytest.warns(DeprecationWarning, match="ServiceCall.tool is deprecated: read `service`"):
        assert call.tool == "calc"
    with pytest.raises(TypeError, match="not both"):
        ServiceCall("calc", [1], tool="calc")
    with pytest.raises(TypeError, match="needs a service name and a request"):
        ServiceCall("calc")


class _OldStyle(LookUpTwice):
    """An orchestra written before services had their name: its mapping is `tools`."""

    def __init__(self, service: RecordingService) -> None:
        super().__init__(service)
        self.tools = self.__dict__.pop("services")


def _runner(orchestra) -> EpisodeRunner:
    specs = {a: AgentSpec("m", SamplingParams()) for a in ("a", "b")}
    return EpisodeRunner(orchestra, {"m": ScriptedEngine()}, specs, invalid_penalty=0.1, seed=0)


def test_an_orchestra_with_tools_instead_of_services_still_runs_with_a_warning():
    service = RecordingService()
    with pytest.warns(DeprecationWarning, match="_OldStyle.tools is deprecated: name the orchestra's services "
                                                "mapping `services`"):
        runner = _runner(_OldStyle(service))
    results = runner.run(_requests(2))
    assert service.batches == [["p0-0", "p1-0"], ["p0-1", "p1-1"]]
    assert [r.outcome.info["found"] for r in results] == [["P0-0", "P0-1"], ["P1-0", "P1-1"]]


def test_an_orchestra_with_services_or_neither_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _runner(LookUpTwice(RecordingService())).services.keys() == {"upper"}
        assert _runner(TwoTurns()).services == {}
