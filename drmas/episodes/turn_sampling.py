"""The sampling of one agent turn: its agent's, under the turn's own, seeded per call.

A turn may carry its own sampling (`AgentTurn.sampling`: an HTTP request's max_tokens and stop strings through
the gateway); the config still bounds every response. With a run seed, each call is sampled from its own
stream, derived from the seed and the call's place (episode id, call index), so an episode samples the same
tokens whatever else shares its batch and a resumed run continues as an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Mapping, Optional

from drmas.engines.base import SamplingParams


def turn_sampling(params: SamplingParams, own: Optional[Mapping[str, object]], seed: Optional[int],
                  call: str) -> SamplingParams:
    """`params` under the turn's `own` sampling, seeded (unless the turn sets its seed) from `seed` and `call`
    (`<episode id>:<call index>`)."""
    own = dict(own or {})
    if own:
        params = _overridden(params, own)
    if seed is None or own.get("seed") is not None:
        return params
    return dataclasses.replace(params, seed=zlib.crc32(f"{seed}:{call}".encode()))


_OVERRIDABLE = ("temperature", "top_p", "max_new_tokens", "stop", "seed", "constraint")


def _overridden(params: SamplingParams, own: Mapping[str, object]) -> SamplingParams:
    """`params` under a turn's own sampling: temperature, top_p, seed and a constraint replace, stop strings add, and
    max_new_tokens is capped by the agent's (the config bounds every response)."""
    unknown = sorted(set(own) - set(_OVERRIDABLE))
    if unknown:
        raise ValueError(f"AgentTurn.sampling: unknown keys {unknown} (known: {', '.join(_OVERRIDABLE)})")
    changes = {key: own[key] for key in ("temperature", "top_p", "seed", "constraint") if own.get(key) is not None}
    if own.get("max_new_tokens") is not None:
        changes["max_new_tokens"] = min(int(own["max_new_tokens"]), params.max_new_tokens)  # type: ignore[arg-type]
    if own.get("stop"):
        changes["stop"] = tuple(dict.fromkeys([*params.stop, *own["stop"]]))  # type: ignore[misc]
    return dataclasses.replace(params, **changes)
