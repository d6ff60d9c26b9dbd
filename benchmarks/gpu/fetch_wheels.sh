#!/usr/bin/env bash
# Download, here, the wheels that benchmarks/gpu/run.sh installs on a lent GPU machine, which cannot reach a package
# index: the pinned packages of wheels.txt, for that machine's Python (3.12), into benchmarks/gpu/wheels/ (ignored by
# git; the device tool's `carry` takes it along). Checks that the folder stays under the 64 MiB that may travel.
#
#   benchmarks/gpu/fetch_wheels.sh                      # for the GPU machine's Python 3.12
#   PYTHON_VERSIONS="3.12 3.11" benchmarks/gpu/fetch_wheels.sh   # and for this machine's, to try the install here
#   TRANSFORMERS= benchmarks/gpu/fetch_wheels.sh        # carry no transformers: run.sh keeps the machine's 5.17
#
# By default it carries transformers 5.24.0 (what CI tests), which run.sh installs over the machine's 5.17: with
# 5.17, grpo_kit's lean sampling loop fails where finished rows leave the batch (benchmarks/gpu/README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
wheels=$here/wheels
pip=(${PIP:-python3 -m pip})
mkdir -p "$wheels"

requirements=$(grep -v '^#' "$here/wheels.txt" | grep -v '^$')
TRANSFORMERS=${TRANSFORMERS-5.24.0}
if [ -n "$TRANSFORMERS" ]; then
    requirements+=$'\n'"transformers==$TRANSFORMERS"
fi
for version in ${PYTHON_VERSIONS:-3.12}; do
    for requirement in $requirements; do
        if [ "$requirement" = "antlr4-python3-runtime==4.9.3" ]; then
            continue  # published as a source archive only: built below
        fi
        "${pip[@]}" download --quiet --no-deps --only-binary :all: --python-version "$version" --implementation cp \
            --dest "$wheels" "$requirement"
    done
done
# omegaconf and hydra-core pin antlr4-python3-runtime 4.9.*, whose only release is a source archive of pure Python:
# build its wheel here (py3-none-any), since the GPU machine cannot build anything it would have to download.
if ! ls "$wheels"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
    "${pip[@]}" wheel --quiet --no-deps --no-binary :all: --wheel-dir "$wheels" antlr4-python3-runtime==4.9.3
fi

bytes=$(du -sb "$wheels" | cut -f1)
echo "$wheels: $(ls "$wheels" | wc -l) wheels, $((bytes / 1024)) KiB"
limit=$((48 * 1024 * 1024))  # of the 64 MiB that travel: the rest is the working tree itself
if [ "$bytes" -gt "$limit" ]; then
    echo "too large to travel beside the working tree (more than 48 MiB)" >&2
    exit 1
fi
