#!/usr/bin/env bash
# The GPU check: on a machine with CUDA, in under 10 minutes, runs the CUDA-only tests, counts the
# host synchronisations of a guarded step, and times benchmarks/overhead.py on the GPU (default
# Guard, the recover policy's ring capture, every probe). Prints one report; without CUDA it says
# so and exits 0.
#
#   bash benchmarks/gpu_check.sh            # from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && PY=.venv/bin/python

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device here; skipping (run it on a GPU machine)"
    exit 0
fi

echo "== CUDA-only tests"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -rfs tests/remedies/test_agc.py \
    tests/pipeline/test_conformance.py tests/test_guard.py tests/test_transfer.py \
    tests/remedies/test_device.py tests/probes/test_adam_ratio.py tests/recovery/test_state.py 2>&1 | grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed"

echo "== host synchronisations per guarded step"
timeout 120 "$PY" benchmarks/gpu_syncs.py

echo "== overhead on the GPU"
timeout 240 "$PY" benchmarks/overhead.py --device cuda --workload gpt2 \
    --variants clip_grad_norm_,guard_default,guard_all_probes,guard_recover \
    --rounds 6 --steps-per-round 10 2>&1 | sed -n '/^workload/,$p'

echo "== overhead on the GPU, AdamW(fused=True): sync=\"deferred\""
timeout 180 "$PY" benchmarks/overhead.py --device cuda --workload gpt2 \
    --variants clip_grad_norm_,guard_default,guard_deferred \
    --rounds 6 --steps-per-round 10 2>&1 | sed -n '/^workload/,$p'
