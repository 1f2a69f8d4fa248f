"""Episode metrics of both training loops (drmas.episodes.tally): the mean reward and each numeric info entry."""

import math

import numpy as np

from drmas.episodes import EpisodeTally
from drmas.mas.base import EpisodeOutcome


def test_info_means_count_each_key_over_the_episodes_that_report_it() -> None:
    tally = EpisodeTally()
    assert tally.scalars() == {}  # nothing finished: nothing logged, not a zero
    tally.add(EpisodeOutcome(reward=1.0, turns=[], info={"approved": True, "rounds": 1, "note": "text"}))
    tally.add(EpisodeOutcome(reward=0.0, turns=[], info={"approved": False, "rounds": 3, "score": np.float32(0.5)}))
    tally.add(EpisodeOutcome(reward=0.5, turns=[], info={"rounds": math.nan, "tags": [1, 2], "none": None}))
    tally.add(EpisodeOutcome(reward=1.0, turns=[], info={"approved": True}, dropped="plugin raised"))  # not counted
    assert tally.scalars() == {"episode/reward_mean": 0.5, "episode/count": 3.0, "episode/info/approved": 0.5,
                               "episode/info/rounds": 2.0, "episode/info/score": 0.5}
    tally.reset()
    assert tally.scalars() == {}
