#!/usr/bin/env bash
# The GPU checks in one go, for a machine with CUDA and torch (no Qt, no registry needed):
#     OUT=some/folder bash tests/perf/run_gpu_checks.sh
# Writes the device, the CUDA-only tests' result, two bench CLI reports (causal prefill;
# GQA decode) and the sweeps of tests/perf/bench_attention_gpu.py (target, gqa, window,
# decode; one process each, so that one that runs long loses only itself) under $OUT.
# Every step has its own time limit; together they stay under ten minutes.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-tests/perf/results}
mkdir -p "$OUT"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda)"
} 2>&1 | tee "$OUT/device.txt"
if python3 -c "import pytest, numpy, hypothesis" 2>/dev/null; then
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_bench.py tests/test_torch_engine.py \
        2>&1 | tail -n 15 | tee "$OUT/cuda-tests.txt"
else
    echo "pytest, numpy or hypothesis missing: CUDA tests not run" | tee "$OUT/cuda-tests.txt"
fi
timeout 45 python3 -m attnviz bench --device cuda --dtype bfloat16 --causal --max-n 16384 \
    --format json --out "$OUT/bench-cli-causal-bf16.json" 2>"$OUT/bench-cli.err"
echo "attnviz bench (causal): exit $?"
timeout 40 python3 -m attnviz bench --device cuda --dtype bfloat16 --heads 16 --kv-heads 4 \
    --d-head 128 --phase decode --min-n 1024 --max-n 131072 --impl naive,sdpa,flash,efficient,cudnn \
    --format json --out "$OUT/bench-cli-decode-gqa-bf16.json" 2>"$OUT/bench-cli-decode.err"
echo "attnviz bench (decode): exit $?"; python3 -m attnviz bench --help >/dev/null
for step in target:130 gqa:60 window:150 decode:60; do
    case=${step%%:*}; limit=${step##*:}
    quick=""; [ "$case" = gqa ] && quick="--quick"
    timeout "$limit" python3 tests/perf/bench_attention_gpu.py --case "$case" $quick \
        2>"$OUT/sweep-$case.err" | tee "$OUT/sweep-$case.txt"
    echo "bench_attention_gpu --case $case: exit ${PIPESTATUS[0]}"
done
cp tests/perf/results/*.json tests/perf/results/*.svg "$OUT/" 2>/dev/null
ls -la "$OUT"
