#!/usr/bin/env bash
# The GPU check, on a lent GPU machine (benchmarks/gpu/README.md): install grpo_kit from the carried wheels with no
# package index, then the `gpu`-marked tests, full vs chunked vs Liger log-prob memory at Qwen2's vocabulary, and a
# short race with TRL on a Qwen2.5-0.5B-shaped random model in bf16; one table at the end. About 6-8 minutes.
# Where there is no CUDA GPU, the install and the tests run (the tests skip) and the CUDA parts say they are skipped.
#
#   benchmarks/gpu/run.sh             # results under $OUT (the device tool's folder that comes back), else /tmp
set -uo pipefail
cd "$(dirname "$0")/../.."
results=${OUT:-$(mktemp -d /tmp/grpo_kit-gpu-XXXX)}
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
started=$SECONDS
stage() { echo; echo "== $1 ($((SECONDS - started)) s)"; }

stage "install from benchmarks/gpu/wheels, no index"
source benchmarks/gpu/install.sh || exit 1
cuda=$($python -c "import torch; print(int(torch.cuda.is_available()))")

stage "gpu-marked tests"
timeout 240 $python -m pytest -q -p no:cacheprovider -m gpu --continue-on-collection-errors \
    --junitxml "$results/gpu-tests.xml" tests plugins 2>&1 | tail -25

if [ "$cuda" = 1 ]; then
    stage "full vs chunked vs Liger log-probs: one micro-batch at vocabulary 151,936 (B 4, T 1,024)"
    timeout 150 $python benchmarks/liger_memory.py --device cuda --steps 3 --json "$results/liger-memory.json"

    stage "race with TRL: Qwen2.5-0.5B's shape, untrained, bf16 autocast, 32 completions of up to 256 tokens a step"
    timeout 330 $python benchmarks/race.py --device cuda --workloads W4gpu --rounds 1 --w4-steps 2-5 --threads 4 \
        --json "$results/race.json"
else
    stage "no CUDA GPU: the Liger memory comparison and the race are skipped"
fi

stage "summary"
$python benchmarks/gpu/summary.py "$results"
