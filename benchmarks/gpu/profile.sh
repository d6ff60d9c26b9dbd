#!/usr/bin/env bash
# Why W4gpu's grpo_kit step took 2.5 times TRL's on an H100 (benchmarks/gpu/README.md, "Profile"): one short run on a
# lent GPU machine, about 3 minutes. Installs as run.sh does, then
# 1. decode_profile.py: the lean sampling loop against `model.generate` (TRL's call) and generate inside one
#    autocast (the bare loop's call), on Qwen2.5-0.5B's shape in bf16, 32 rows: ms, aten ops and syncs per token;
# 2. race.py --profile on W4gpu for grpo_kit and bare, steps 2-2: where a step's time goes, phase by phase.
#
#   benchmarks/gpu/profile.sh          # device tool: run(command="benchmarks/gpu/profile.sh",
#                                      #   carry=["benchmarks/gpu/wheels"], timeout_s=300)
set -uo pipefail
cd "$(dirname "$0")/../.."
results=${OUT:-$(mktemp -d /tmp/grpo_kit-gpu-XXXX)}
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
started=$SECONDS
stage() { echo; echo "== $1 ($((SECONDS - started)) s)"; }

stage "install from benchmarks/gpu/wheels, no index"
source benchmarks/gpu/install.sh || exit 1
device=$($python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
if [ "$device" = cpu ]; then  # a dry run here: the same steps on a small model, at a CPU's pace
    decode=(--shape narrow --vocab 4096 --new-tokens 4 --gpu-path)
    race=(--workloads W4a --w4-steps 2-2)
else
    decode=(--new-tokens 24)
    race=(--workloads W4gpu --w4-steps 2-2 --threads 4)
fi

stage "lean sample vs model.generate per decode step ($device)"
timeout 80 $python benchmarks/gpu/decode_profile.py --device $device --top "${decode[@]}" 2>&1 \
    | grep -v "Writing model\|Loading weights" | tee "$results/decode-profile.txt"

stage "race.py --profile, grpo_kit and bare ($device)"
timeout 170 $python benchmarks/race.py --device $device --profile --sides grpo_kit,bare "${race[@]}" 2>&1 \
    | grep -v "Writing model\|Loading weights" | tee "$results/race-profile.txt"
stage "done"
