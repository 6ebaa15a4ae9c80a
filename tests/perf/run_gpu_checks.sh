#!/usr/bin/env bash
# The GPU checks in one go, for a machine with CUDA and torch (no Qt, no registry needed):
#     OUT=some/folder bash tests/perf/run_gpu_checks.sh
# Writes the device, the CUDA-only tests' result, the bench CLI's report and the target
# sweep (tests/perf/bench_attention_gpu.py) under $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-tests/perf/results}
mkdir -p "$OUT"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda)"
} 2>&1 | tee "$OUT/device.txt"
if python3 -c "import pytest, numpy, hypothesis" 2>/dev/null; then
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_bench.py tests/test_torch_engine.py \
        2>&1 | tail -n 15 | tee "$OUT/cuda-tests.txt"
else
    echo "pytest, numpy or hypothesis missing: CUDA tests not run" | tee "$OUT/cuda-tests.txt"
fi
timeout 150 python3 -m attnviz bench --device cuda --dtype bfloat16 --causal --max-n 32768 \
    --format json --out "$OUT/bench-cli-causal-bf16.json" 2>"$OUT/bench-cli.err"
echo "attnviz bench: exit $?"; python3 -m attnviz bench --help >/dev/null
timeout 300 python3 tests/perf/bench_attention_gpu.py 2>"$OUT/sweep.err" | tee "$OUT/sweep.txt"
cp tests/perf/results/*.json "$OUT/" 2>/dev/null
ls -la "$OUT"
