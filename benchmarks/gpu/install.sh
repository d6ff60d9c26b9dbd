# Sourced by run.sh and speed.sh, in the repository root, with $python and $results set: installs the carried
# wheels (benchmarks/gpu/wheels) and the project with no package index, writes versions.txt and pip-check.txt
# under $results, and returns 1 where an install or an import fails.
wheels=benchmarks/gpu/wheels
requirements=$(grep -v '^#' benchmarks/gpu/wheels.txt | grep -v '^$')
if ls $wheels/transformers-*.whl >/dev/null 2>&1; then  # carried by TRANSFORMERS=... fetch_wheels.sh
    requirements+=" transformers==$(basename $wheels/transformers-*.whl | cut -d- -f2)"
fi
plugins=$(for plugin in plugins/grpo_kit_*/; do echo "-e ${plugin%/}"; done)
# --no-deps: everything else is the machine's own (pip check below lists what disagrees with a requirement)
$python -m pip install --quiet --no-index --no-deps --find-links $wheels $requirements || return 1
$python -m pip install --quiet --no-index --no-deps --no-build-isolation -e . $plugins || return 1
$python -m pip check | grep -v "^No broken" | tee "$results/pip-check.txt"
$python - <<'PYTHON' | tee "$results/versions.txt" || return 1
import importlib.metadata as metadata
import torch
import grpo_kit, trl, datasets, hydra, math_verify  # noqa: F401, E401: each import must work
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"
names = ["torch", "transformers", "accelerate", "trl", "liger-kernel", "triton", "datasets", "peft", "grpo-kit"]
print(", ".join(f"{name} {version(name)}" for name in names))
print("GPU:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
PYTHON
