"""What an ended episode becomes: one `Sample` per LLM call, with the reward the outcome gives its turn.

Kept apart from the episode driver (`episodes.py`) because it is the one place where the orchestra's rewards
meet the training data: the reward of each turn as `EpisodeOutcome.turn_reward` gives it (per turn, per agent
or the episode's), minus the format penalty for an invalid turn, and the checks that refuse rewards nothing
could be trained on. A scripted agent's turn is a call without a generation: it counts as a turn and makes no
sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from drmas.core.sample import STORABLE, Sample, storable
from drmas.engines.base import Generation
from drmas.mas.base import EpisodeOutcome


@dataclass
class Call:
    """One turn of an episode as the driver made it."""

    agent: str
    model: str
    prompt_ids: list[int]
    generation: Optional[Generation]  # None: a scripted agent's turn (no sample)
    temperature: float = 1.0  # what the response was sampled at (the learner recomputes log-probs at it)


def episode_samples(episode_id: str, group_id: str, calls: Sequence[Call], outcome: EpisodeOutcome,
                    agents: Mapping[str, object], invalid_penalty: float) -> list[Sample]:
    """The samples of an ended episode; a dropped one has none (its group is dropped as incomplete). Raises
    (a plugin failure: the driver drops the episode) when the outcome does not fit the calls made."""
    if outcome.dropped:
        return []
    if len(outcome.turns) != len(calls):
        raise RuntimeError(f"orchestra reported {len(outcome.turns)} turns for {len(calls)} calls in episode "
                           f"{episode_id}")
    rewards = turn_rewards(outcome, agents, f"episode {episode_id}")
    samples = []
    for index, (call, turn) in enumerate(zip(calls, outcome.turns)):
        if call.generation is None:
            continue  # a scripted agent's turn: no tokens to train on
        samples.append(
            Sample(
                episode_id=episode_id,
                group_id=group_id,
                agent=call.agent,
                model=call.model,
                turn=index,
                prompt_ids=call.prompt_ids,
                response_ids=call.generation.token_ids,
                behaviour_logprobs=call.generation.logprobs,
                policy_version=call.generation.version,
                policy_incarnation=call.generation.incarnation,
                temperature=call.temperature,
                valid=turn.valid,
                reward=rewards[index] - invalid_penalty * (0.0 if turn.valid else 1.0),
                episode_reward=outcome.reward,
            )
        )
    return samples


def turn_rewards(outcome: EpisodeOutcome, agents: Mapping[str, object], where: str) -> list[float]:
    """Each turn's reward before the format penalty; refuses rewards that cannot be trained on (a length
    other than the turns', an agent name the config does not have, a value that is not a finite number the buffer can store)."""
    if outcome.turn_rewards is not None and len(outcome.turn_rewards) != len(outcome.turns):
        raise RuntimeError(f"orchestra returned {len(outcome.turn_rewards)} turn_rewards for "
                           f"{len(outcome.turns)} turns in {where}")
    unknown = sorted(set(outcome.agent_rewards or ()) - set(agents))
    if unknown:
        raise RuntimeError(f"orchestra returned agent_rewards for {unknown} in {where}, which are not agents "
                           f"(agents: {sorted(agents)}); key them by agent name, not role")
    rewards = []
    for index in range(len(outcome.turns)):
        try:
            value = outcome.turn_reward(index)
        except (TypeError, ValueError):
            value = math.nan
        if not storable(value):
            raise RuntimeError(f"orchestra returned a reward that is not {STORABLE} ({value}) for turn {index} "
                               f"({outcome.turns[index].agent}) in {where}")
        rewards.append(value)
    return rewards
