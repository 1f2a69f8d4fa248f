"""The RL algorithm's parts, chosen by name: advantage estimators (`ADVANTAGE_ESTIMATORS`,
`algorithm.estimator`) and policy losses (`POLICY_LOSSES`, `algorithm.loss`), with the running per-agent reward
statistics they use. Importing the package registers the built-ins; plugins register theirs through `drmas.api`.
See docs/algorithms.md for each one's formula and when to use it."""

from drmas.algorithms import cispo, gspo, leave_one_out, normalised, ppo  # noqa: F401  (register the built-ins)
from drmas.algorithms.estimators import ADVANTAGE_ESTIMATORS, AdvantageBatch, EstimatorContext, estimate
from drmas.algorithms.losses import POLICY_LOSSES, LossInputs, LossOutput, policy_loss

__all__ = ["ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "AdvantageBatch", "EstimatorContext", "LossInputs", "LossOutput",
           "estimate", "policy_loss"]
