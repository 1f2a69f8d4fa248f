"""What the gateway's tests share: the example's config, one engine per module (the smoke run's tiny primed model),
and a runner driving it in the test's thread, as a rollout does, while a program calls the gateway from another."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import openai
import pytest
from pipeline_harness import smoke_model  # noqa: F401  (a fixture)

from drmas import assembly
from drmas.episodes import EpisodeRequest, EpisodeRunner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "openai_agents"
CONFIG = EXAMPLE / "config.yaml"
IDLE = ["python", "-c", "import time; time.sleep(600)"]  # a program that calls nothing: the test calls instead


def config_of(*overrides: str):
    return assembly.load_config(CONFIG, [f"system.workdir={EXAMPLE}", *overrides])


@pytest.fixture(scope="module")
def engine(smoke_model):  # noqa: F811
    cfg = config_of()
    return {"policy": assembly.build_engine(cfg, "policy", assembly.model_path(cfg, "policy"), 0)}


def runner_of(cfg, engine):
    orchestra = assembly.build_orchestra(cfg, assembly.build_task(cfg))
    return EpisodeRunner(orchestra, engine, assembly.agent_specs(cfg), cfg.algorithm.invalid_penalty, seed=0)


def requests_of(cfg, groups: int, size: int, tag: str = "g") -> list[EpisodeRequest]:
    problems = list(assembly.build_task(cfg).split("train"))[:groups]
    return [EpisodeRequest(f"{tag}{g}-e{e}", f"{tag}{g}", p) for g, p in enumerate(problems) for e in range(size)]


def run_program(runner: EpisodeRunner, requests, program=None):
    """runner.run in this thread (the engine's) while `program(url, token)` runs in another; both must succeed."""
    failures: list[BaseException] = []

    def call() -> None:
        try:
            program(runner.orchestra.service.url, runner.orchestra.service.token)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the test's thread)
            failures.append(exc)

    runner.orchestra.start()
    thread = threading.Thread(target=call, daemon=True) if program else None
    try:
        if thread:
            thread.start()
        results = runner.run(requests)
        if thread:
            thread.join(30)  # it may still ask the gateway about the episodes that ended
    finally:
        assembly.close_orchestra(runner.orchestra)
    if failures:
        raise failures[0]
    return results


def claim(url: str, token: str) -> dict:
    return httpx.post(f"{url}/drmas/v1/episodes", json={}, headers={"Authorization": f"Bearer {token}"}).json()


def end(url: str, episode: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/drmas/v1/episodes/{episode}/reward", json=body)


def ask(client: openai.OpenAI, episode: str, **kwargs):
    kwargs.setdefault("messages", [{"role": "user", "content": "What is 2 + 2?"}])
    return client.chat.completions.create(model=kwargs.pop("model", "solver"), user=episode, **kwargs)
