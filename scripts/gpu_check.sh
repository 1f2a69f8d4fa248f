#!/usr/bin/env bash
# A short GPU check of drmas on a machine with NVIDIA GPUs: vLLM engines, learners on CUDA and the weight push
# into the running engines, on the tiny smoke models (minutes, not hours). It prints the figures a GPU user
# asks first: the engine vs learner log-prob gap on on-policy samples, the push rate, generation tokens/s.
#
#   bash scripts/gpu_check.sh            # installs vLLM (CUDA build) if it is missing: needs PyPI access
#
# With two GPUs or more the learners take GPU 1 and the rollout's in-process vLLM engines GPU 0, and weights
# travel over NCCL (straight into the engine's worker); with one GPU, learners and rollout share it and weights
# travel over gloo (NCCL refuses two ranks on one device).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT_DIR=${OUT_DIR:-runs/gpu_check}
export PYTHONUNBUFFERED=1 VLLM_ENABLE_V1_MULTIPROCESSING=0

$PY -c "import vllm" 2>/dev/null || $PY -m pip install -q -e ".[vllm]"
$PY -c "import drmas" 2>/dev/null || $PY -m pip install -q -e .
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
[ "$GPUS" -ge 1 ] || { echo "gpu_check: no CUDA device visible" >&2; exit 2; }
if [ "$GPUS" -ge 2 ]; then
  PLACE=(models.solver_model.device=cuda:1 models.verifier_model.device=cuda:1 pipeline.weights.backend=nccl)
else
  PLACE=(models.solver_model.device=cuda:0 models.verifier_model.device=cuda:0 pipeline.weights.backend=gloo)
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "gpu_check: $GPUS GPU(s); placement ${PLACE[*]}"

$PY -m drmas.cli run --config configs/smoke_async.yaml "trainer.output_dir=$OUT_DIR" trainer.overwrite=true \
  trainer.steps=8 rollout.engine=vllm "rollout.engine_args={gpu_memory_utilization: 0.15, enforce_eager: true}" \
  pipeline.num_rollouts=1 pipeline.learner_base_port=0 pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0 \
  pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0 "${PLACE[@]}"

$PY - "$OUT_DIR" <<'EOF'
import statistics, sys
from pathlib import Path
from drmas.runtime.metrics import read_metrics

out = Path(sys.argv[1])
for learner in sorted(out.glob("learner-*")):
    model = learner.name.removeprefix("learner-")
    steps = [r for r in read_metrics(learner / "metrics.jsonl") if f"loss/{model}" in r]
    diffs = [v for r in steps for k, v in r.items() if k.startswith(f"logp_diff/{model}/")]
    push = [r[f"weight_sync/{model}/seconds"] for r in steps[1:]]
    print(f"{model}: {len(steps)} steps, on-policy max |learner - engine| log-prob {max(diffs):.2e}, "
          f"push median {statistics.median(push):.3f} s, grad_norm median "
          f"{statistics.median(r[f'grad_norm/{model}'] for r in steps):.3f}")
rollout = read_metrics(out / "rollout-0" / "metrics.jsonl")
rates = [r["throughput/rollout/tokens_per_s"] for r in rollout if r["throughput/rollout/tokens_per_s"] > 0]
print(f"rollout generation: median {statistics.median(rates):.0f} tokens/s over {len(rates)} reports")
EOF
