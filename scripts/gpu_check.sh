#!/usr/bin/env bash
# The GPU check of drmas, one script, on a machine with an NVIDIA GPU and possibly no network (issue 24):
# prints the figures a GPU run is judged by and runs the GPU test tier, in under 8 minutes on one GPU.
#
#   bash scripts/gpu_prepare.sh      # where PyPI is reachable: .whl/ (wheels) and .gpu_cache/ (tokenizer)
#   bash scripts/gpu_check.sh        # on the GPU machine, with .whl/ and .gpu_cache/ carried along
#
# Needs Python with torch (CUDA) and transformers; whatever else drmas imports comes from .whl/ when missing
# (installed with --no-index into a scratch --target, put on PYTHONPATH). Tiny models are built there from
# the tokenizer in .gpu_cache/ (DRMAS_CACHE). Every step is bounded by a timeout and its failure is reported
# at the end, so one failing step never hides the other figures. The steps:
#   1. bench/gpu_figures.py: the 252M-parameter tiny Qwen2 of the issue: priming build time, the on-policy
#      log-prob gap (float32 and bfloat16 contracts), engine vs transformers generate() tokens/s, weight push
#      GB/s (gloo, CUDA parameters into an engine on the GPU), learner step time;
#   2. bench/rollout_busy.py: rollout tokens/s against the engine's capacity on the same work (goal >= 0.8);
#   3. the async pipeline (drmas run, two 252M models on the GPU, 64 episodes per step): rollout tokens/s,
#      learner step time, push time and the on-policy gap, from the runs' metrics;
#   4. vLLM: the async smoke run on vLLM when vllm is importable (else one line saying it was skipped);
#   5. pytest -m gpu (tests/test_gpu.py).
#
# DRMAS_GPU_CHECK_DEVICE=cpu runs the same steps on the CPU with small shapes: a dry run of this script on a
# machine without a GPU (its figures then say nothing about GPUs).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT_DIR=${OUT_DIR:-runs/gpu_check}
SITE=${SITE:-/tmp/drmas-gpu-site}
DEVICE=${DRMAS_GPU_CHECK_DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then
  FIGURES=(--batches 64,256 --new-tokens 128 --prime-steps 100)
  BIG="{hidden_size: 1024, num_layers: 12, num_heads: 16, intermediate_size: 4096, prime_steps: 0}"
  EPISODES=(rollout.prompts_per_step=16 rollout.max_new_tokens=128 rollout.max_batch_size=64) BUSY=64 SLOW=1
else  # (the CPU builds the primed smoke models and generates ~100x slower: more time per step)
  FIGURES=(--hidden 64 --layers 2 --heads 2 --intermediate 128 --batches 8 --new-tokens 16 --prime-steps 5 --reps 2)
  BIG="{hidden_size: 64, num_layers: 2, num_heads: 2, intermediate_size: 128, prime_steps: 0}"
  EPISODES=(rollout.prompts_per_step=4 rollout.max_new_tokens=16 rollout.max_batch_size=16) BUSY=16 SLOW=5
fi
export DRMAS_GPU_TIER_DEVICE=$DEVICE
export PYTHONUNBUFFERED=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT_DIR"
FAILED=()
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT_DIR/NAME.log, remember failures
  local name=$1 limit=$(( $2 * SLOW )); shift 2
  local start=$SECONDS
  echo "== $name"
  timeout --kill-after=20 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log" \
    | grep --line-buffered -E "^(FIGURE|config=|rollout |engine |ratio|model:|[0-9]+ (passed|failed)|FAILED|ERROR|SKIPPED)"
  local statuses=("${PIPESTATUS[@]}")
  local rc=${statuses[0]}
  echo "   ($name: rc $rc, $((SECONDS - start)) s)"
  [ "$rc" -eq 0 ] || FAILED+=("$name (rc $rc, log $OUT_DIR/$name.log)")
}

# ---- offline dependencies and model cache
if [ -d .whl ]; then
  missing=$($PY scripts/check_wheels.py --missing .whl)
  if [ -n "$missing" ]; then
    rm -rf "$SITE" && $PY -m pip install -q --no-index --no-deps --target "$SITE" $missing || exit 2
    echo "installed from .whl into $SITE: $(echo "$missing" | wc -w) wheels"
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -d .gpu_cache ] && export DRMAS_CACHE=$PWD/.gpu_cache
$PY -c "import drmas.cli, zmq, msgspec, omegaconf, math_verify" || { echo "gpu_check: drmas does not import" >&2; exit 2; }
GPUS=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
[ "$GPUS" -ge 1 ] || [ "$DEVICE" = cpu ] || { echo "gpu_check: no CUDA device visible" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
$PY -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}, $GPUS GPU(s)')"

# ---- 1. the figures of issue 24 on the 252M model
step figures 220 $PY bench/gpu_figures.py --device "$DEVICE" "${FIGURES[@]}"

# ---- 2. how busy the rollout keeps the engine (smoke models: short turns, the hard case)
step rollout_busy 75 $PY bench/rollout_busy.py --config configs/smoke_async.yaml --batch "$BUSY" --seconds 10 --rounds 2 \
  "models.solver_model.device=$DEVICE" "models.verifier_model.device=$DEVICE"

# ---- 3. the async pipeline, two 252M models on this GPU, 64 episodes per step (random weights: every turn runs
#         to max_new_tokens, a steady load)
PIPE=("models.solver_model.tiny=$BIG" "models.verifier_model.tiny=$BIG" "models.solver_model.device=$DEVICE"
      "models.verifier_model.device=$DEVICE" pipeline.weights.backend=gloo pipeline.num_rollouts=1 rollout.group_size=4
      "${EPISODES[@]}" "models.solver_model.optim={lr: 1.0e-6}"
      "models.verifier_model.optim={lr: 1.0e-6}" trainer.steps=6 logging.tensorboard=false pipeline.learner_base_port=0
      pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0 pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0)
step pipeline 120 $PY -m drmas.cli run --config configs/smoke_async.yaml "trainer.output_dir=$OUT_DIR/pipeline" \
  trainer.overwrite=true "${PIPE[@]}"
$PY bench/run_figures.py "$OUT_DIR/pipeline" || FAILED+=("pipeline figures")

# ---- 4. vLLM, only where it is importable
if [ "$DEVICE" = cuda ] && $PY -c "import vllm" 2>/dev/null; then
  if [ "$GPUS" -ge 2 ]; then
    PLACE=(models.solver_model.device=cuda:1 models.verifier_model.device=cuda:1 pipeline.weights.backend=nccl)
  else
    PLACE=(models.solver_model.device=cuda:0 models.verifier_model.device=cuda:0 pipeline.weights.backend=gloo)
  fi
  step vllm 150 $PY -m drmas.cli run --config configs/smoke_async.yaml "trainer.output_dir=$OUT_DIR/vllm" \
    trainer.overwrite=true trainer.steps=6 rollout.engine=vllm \
    "rollout.engine_args={gpu_memory_utilization: 0.15, enforce_eager: true}" pipeline.num_rollouts=1 \
    pipeline.learner_base_port=0 pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0 \
    pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0 "${PLACE[@]}"
  $PY bench/run_figures.py "$OUT_DIR/vllm" || FAILED+=("vllm figures")
elif [ "$DEVICE" = cuda ]; then
  echo "== vllm: not importable here, skipped"
else
  echo "== vllm: skipped (dry run on the CPU)"
fi

# ---- 5. the GPU test tier
step pytest_gpu 180 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py

if [ ${#FAILED[@]} -gt 0 ]; then
  printf 'gpu_check: FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "gpu_check: every step passed"
