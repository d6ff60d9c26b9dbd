#!/usr/bin/env bash
# Where grpo_kit's and TRL's time goes on a lent GPU, in one call of at most 8 minutes (benchmarks/gpu/README.md):
# install as run.sh does, then
# 1. decode_bench.py: the prompts' pass and ms per decode step, cold and warm, with peak memory, of `generate` as TRL
#    calls it, `generate` with cuDNN's attention off, the lean loop and the static loop, each in a fresh process
#    (Qwen2.5-0.5B's shape, bf16, 32 rows, half the prompts left-padded, 128 new tokens, EOS suppressed);
# 2. race.py --profile on W4gpu, steps 2-3, grpo_kit and TRL: ms per generated token, peak memory, each side's phase
#    table (seconds and peak memory per phase, CUDA synchronised at every phase boundary), the time to the first step
#    and after the last;
# 3. one Markdown table of it all (speed_summary.py).
#
#   run(command="benchmarks/gpu/speed.sh", carry=["benchmarks/gpu/wheels"], timeout_s=480)   # the device tool
#   benchmarks/gpu/speed.sh --dry-run   # here, without CUDA: the same steps on a small model, at a CPU's pace
set -uo pipefail
cd "$(dirname "$0")/../.."
results=${OUT:-$(mktemp -d /tmp/grpo_kit-gpu-XXXX)}
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
started=$SECONDS
stage() { echo; echo "== $1 ($((SECONDS - started)) s)"; }

if [ "${1:-}" = --dry-run ]; then
    device=cpu
    decode=(--device cpu --shape narrow --vocab 4096 --new-tokens 8 --timeout 60)
    race=(--device cpu --workloads W1 --steps 2-3)
else
    stage "install from benchmarks/gpu/wheels, no index"
    source benchmarks/gpu/install.sh || exit 1
    device=cuda
    decode=(--device cuda --timeout 45)
    race=(--device cuda --workloads W4gpu --w4-steps 2-3 --threads 4)
    if [ "$($python -c 'import torch; print(int(torch.cuda.is_available()))')" != 1 ]; then
        echo "no CUDA GPU here: benchmarks/gpu/speed.sh --dry-run runs the same steps on a CPU"
        exit 1
    fi
fi

stage "decode: generate (TRL's call), generate without cuDNN, lean, static ($device)"
timeout 200 $python benchmarks/gpu/decode_bench.py "${decode[@]}" --json "$results/decode.json" 2>&1 \
    | grep -v "Writing model\|Loading weights"

stage "race.py --profile, grpo_kit and TRL ($device)"
timeout 220 $python benchmarks/race.py --profile --sides grpo_kit,TRL "${race[@]}" --json "$results/race.json" 2>&1 \
    | grep -v "Writing model\|Loading weights"

stage "summary"
$python benchmarks/gpu/speed_summary.py "$results" | tee "$results/speed.md"
