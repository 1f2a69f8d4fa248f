"""The episode driver: many multi-agent episodes at once on a set of engines (`EpisodeRunner`), each bounded
and isolated from the others' failures. Used alike by the rollout processes, the colocated loop and every kind
of evaluation; it knows nothing of buffers, learners or runs."""

from drmas.episodes.runner import EpisodeRunner
from drmas.episodes.tally import EpisodeTally
from drmas.episodes.types import AgentSpec, EpisodeRequest, EpisodeResult

__all__ = ["AgentSpec", "EpisodeRequest", "EpisodeResult", "EpisodeRunner", "EpisodeTally"]
