"""Evaluation of multi-agent systems: one evaluator, three kinds of evaluation, driven by either loop.

- `evaluator.py`: the one `Evaluator`: an `EvalSource` (which episodes) and an `EvalSink` (where results go);
  run directly on an episode runner, or fed into an episode stream;
- `kinds.py`: the three kinds, each a source and a sink built from the config: `heldout` (accuracy before and
  after training), `interval` (`eval.interval`, during training), `checkpoint` (`drmas eval`);
- the sinks: `heldout.py` (accuracy, for the loop to log), `evals_log.py` (evals.jsonl and TensorBoard
  `eval/`), `outputs.py` (`drmas eval`'s directory, its files and renderings);
- the drivers beyond `Evaluator.run`: `interval.py` (when an `eval.interval` evaluation is due, and rollout 0's
  feed of it into its episode stream), `async_heldout.py` (the async launcher, on engines of its own);
- `drmas eval` itself: `command.py` (the command), `models.py` (which checkpoint each model comes from),
  `resume.py` (`eval.resume`);
- the numbers: `passk.py` (avg@k / pass@k and the unbiased estimator), `behaviour.py` (per-agent statistics).

Only `heldout_accuracy` is re-exported here, so importing the package stays as light as before.
"""

from drmas.evaluation.heldout import heldout_accuracy

__all__ = ["heldout_accuracy"]
