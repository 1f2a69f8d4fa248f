"""Evaluation of multi-agent systems.

- `heldout.py`: held-out accuracy scored by the training loop before and after training;
- `passk.py`: avg@k / pass@k (and the unbiased pass@k estimator) from a table of per-sample rewards;
- `behaviour.py`: per-agent behaviour statistics (calls, validity, orchestra counters) over episodes;
- `command.py`: `drmas eval`, k samples per question of a checkpoint on one or more benchmarks;
- `interval.py` (the colocated loop's) and `stream.py` (a rollout's): `eval.interval`, evaluations during training;
- `async_heldout.py`: the async launcher's held-out scoring before and after training.

Only `heldout_accuracy` is re-exported here, so importing the package stays as light as before.
"""

from drmas.evaluation.heldout import heldout_accuracy

__all__ = ["heldout_accuracy"]
