#!/usr/bin/env bash
# Create .venv-peers: peer engines for the side-by-side benchmark (issue 6), never a runtime
# dependency. Idempotent: reruns only reinstall when this file's pins change.
#
#   bash tools/setup_peers.sh            # then: .venv-peers/bin/python -m sol_control.bench.peers --help
#
# In: ONNX Runtime GenAI (plain + speculative) and Hugging Face transformers (plain + assisted
# generation), both on the CPU torch build from local disk (an unpinned torch pulls a multi-GB
# CUDA build). Not yet: llama-cpp-python (compiles llama.cpp from source, ~10 min of both cores,
# and needs the GGUF converter from its sdist) and OpenVINO GenAI (optimum-intel export pulls a
# large dependency tree and needs torchvision removed); see docs/PEERS notes in the benchmark issue.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEERS_VENV:-$REPO/.venv-peers}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.peers-installed"

PINS=(
  "torch==2.13.0"
  "transformers==5.24.0"
  "accelerate==1.15.0"
  "onnxruntime-genai==0.18.0"
  "onnx==1.23.2"
  "onnx-ir==1.1.0"
  "numpy==2.4.6"
  "safetensors==0.8.0"
)
WANT="$(printf '%s\n' "${PINS[@]}")"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "peers venv up to date: $VENV"
  exit 0
fi

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf '%s\n' "${PINS[@]}" > "$CONSTRAINTS"
"$VENV/bin/pip" install -q --upgrade pip
# torch first, alone and pinned, so nothing resolves to a CUDA build; then the rest under -c.
"$VENV/bin/pip" install -q -c "$CONSTRAINTS" "torch==2.13.0"
"$VENV/bin/pip" install -q -c "$CONSTRAINTS" "${PINS[@]:1}" pydantic
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "transformers", "onnxruntime-genai", "onnxruntime", "onnx-ir"):
    print(f"{name}=={md.version(name)}")
PY
echo "$WANT" > "$STAMP"
echo "peers venv ready: $VENV"
