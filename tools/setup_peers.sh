#!/usr/bin/env bash
# Create the peer-engine venvs for the side-by-side benchmark (issue 6). They are never a runtime
# dependency, and each engine gets its own venv because their pins clash (OpenVINO's exporter wants
# other transformers/optimum versions than ORT GenAI's builder).
#
#   bash tools/setup_peers.sh [all|genai|ov|llama ...]     # default: all
#
#   genai  .venv-peers  ONNX Runtime GenAI (plain + speculative), transformers (plain + assisted),
#                       onnx (tools/onnx_to_hf.py rebuilds HF folders from a bundle's ONNX here)
#   ov     .venv-ov     OpenVINO GenAI (plain + speculative), optimum-intel export, NNCF int8/int4
#   llama  .venv-llama  llama-cpp-python (compiles llama.cpp: ~13 min on 2 cores) plus the GGUF
#                       converter from the same source package
#
# Idempotent: a venv is only (re)installed when its pins below change (stamp file in the venv).
# torch is installed first, alone and pinned to the CPU build on local disk, and then kept pinned
# through a constraints file: an unpinned resolver pulls a multi-GB CUDA build.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH="torch==2.13.0"

GENAI_PINS=(
  "$TORCH"
  "transformers==5.24.0"
  "accelerate==1.15.0"
  "onnxruntime-genai==0.18.0"
  "onnx==1.23.2"
  "onnx-ir==1.1.0"
  "numpy==2.4.6"
  "safetensors==0.8.0"
)
OV_PINS=(
  "$TORCH"
  "openvino==2026.4.1"
  "openvino-genai==2026.4.1.0"
  "openvino-tokenizers==2026.4.1.0"
  "optimum-intel[openvino]==2.2.0"
  "optimum==2.3.0"
  "nncf==3.4.0"
  "transformers==5.5.4"
  "numpy==2.4.6"
)
LLAMA_VERSION="0.3.36"
LLAMA_PINS=(
  "$TORCH"
  "llama-cpp-python==$LLAMA_VERSION"
  "numpy==2.4.6"
  "sentencepiece==0.2.3"
  "transformers==5.24.0"
  "safetensors==0.8.0"
)

current() {  # VENV PIN... : true if VENV was installed with exactly these pins
  local venv="$1"; shift
  if [[ -f "$venv/.peers-installed" && "$(cat "$venv/.peers-installed")" == "$(printf '%s\n' "$@")" ]]; then
    echo "up to date: $venv"
    return 0
  fi
  return 1
}

# install VENV PIN... : create VENV and install the pins, torch first. (Not called in an `||` list:
# bash would then ignore `set -e` inside it and stamp a failed install.)
install() {
  local venv="$1"; shift
  [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv"
  local constraints
  constraints="$(mktemp)"
  printf '%s\n' "$@" | sed 's/\[[^]]*\]//' > "$constraints"  # a constraint may not carry [extras]
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -c "$constraints" "$TORCH"
  "$venv/bin/pip" install -q -c "$constraints" "${@:2}"
  rm -f "$constraints"
}

stamp() {  # VENV PIN... : mark VENV as installed with these pins
  local venv="$1"; shift
  printf '%s\n' "$@" > "$venv/.peers-installed"
  echo "ready: $venv"
}

setup_genai() {
  local venv="${PEERS_VENV:-$REPO/.venv-peers}"
  current "$venv" "${GENAI_PINS[@]}" && return 0
  install "$venv" "${GENAI_PINS[@]}"
  "$venv/bin/pip" install -q pydantic
  stamp "$venv" "${GENAI_PINS[@]}"
}

setup_ov() {
  local venv="${OV_VENV:-$REPO/.venv-ov}"
  current "$venv" "${OV_PINS[@]}" && return 0
  install "$venv" "${OV_PINS[@]}"
  # optimum-intel's exporter breaks on the torchvision that comes along (PEERS.md); nothing needs it.
  "$venv/bin/pip" uninstall -q -y torchvision || true
  stamp "$venv" "${OV_PINS[@]}"
}

setup_llama() {
  local venv="${LLAMA_VENV:-$REPO/.venv-llama}"
  # No wheel exists for this platform: pip compiles llama.cpp; keep it to two jobs (2-core machine).
  current "$venv" "${LLAMA_PINS[@]}" && return 0
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" install "$venv" "${LLAMA_PINS[@]}"
  # The HF -> GGUF converter is not installed by the wheel; it ships (with the matching gguf-py)
  # inside the source package, so unpack that next to the venv's site-packages.
  local src="$venv/llama-cpp-src" tmp
  tmp="$(mktemp -d)"
  "$venv/bin/pip" download -q --no-binary :all: --no-deps -d "$tmp" "llama-cpp-python==$LLAMA_VERSION"
  rm -rf "$src" && mkdir -p "$src"
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$src" --strip-components=1
  rm -rf "$tmp"
  test -f "$src/vendor/llama.cpp/convert_hf_to_gguf.py"
  "$venv/bin/pip" install -q -c <(printf '%s\n' "${LLAMA_PINS[@]}") "$src/vendor/llama.cpp/gguf-py"
  stamp "$venv" "${LLAMA_PINS[@]}"
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(all)
for t in "${targets[@]}"; do
  case "$t" in
    all) setup_genai; setup_ov; setup_llama ;;
    genai|peers) setup_genai ;;
    ov|openvino) setup_ov ;;
    llama|llama-cpp) setup_llama ;;
    *) echo "usage: $0 [all|genai|ov|llama ...]" >&2; exit 2 ;;
  esac
done
