#!/usr/bin/env bash
# Prepare a ComfyUI source folder for tests/test_comfy_integration.py, or for trying the pack by hand:
# a virtual environment in <ComfyUI>/.venv with torch, ComfyUI's requirements and this repository (editable).
#
#   git clone https://github.com/Comfy-Org/ComfyUI /path/to/ComfyUI
#   comfy_nodes/tools/setup_comfyui.sh /path/to/ComfyUI
#   COMFYUI_DIR=/path/to/ComfyUI python -m pytest -q -s tests/test_comfy_integration.py
#
# TORCH_PACKAGES picks the torch build (default: "torch torchvision torchaudio", whatever pip resolves), e.g.
#   TORCH_PACKAGES="torch torchvision torchaudio --index-url https://download.pytorch.org/whl/cpu"
# An existing .venv is reused. When ComfyUI's requirements do not install as a whole (offline, no wheel for
# this Python), each line is tried alone and the ones that fail are listed at the end.
set -euo pipefail

comfyui="$(cd "${1:?usage: $0 COMFYUI_SOURCE_FOLDER}" && pwd)"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ ! -f "$comfyui/main.py" || ! -f "$comfyui/requirements.txt" ]]; then
  echo "$comfyui is not a ComfyUI source folder: it has no main.py and requirements.txt" >&2
  exit 1
fi

python3 -m venv "$comfyui/.venv"
pip=("$comfyui/.venv/bin/python" -m pip)
# shellcheck disable=SC2086  # TORCH_PACKAGES is a list of arguments
"${pip[@]}" install ${TORCH_PACKAGES:-torch torchvision torchaudio}

skipped=()
if ! "${pip[@]}" install -r "$comfyui/requirements.txt"; then
  while IFS= read -r line; do
    requirement="${line%%#*}"
    requirement="${requirement//[[:space:]]/}"
    [[ -z "$requirement" ]] && continue
    "${pip[@]}" install "$requirement" || skipped+=("$requirement")
  done < "$comfyui/requirements.txt"
fi
"${pip[@]}" install -e "$repo"

version="$(cd "$comfyui" && .venv/bin/python -c 'import comfyui_version; print(comfyui_version.__version__)' 2>/dev/null || echo unknown)"
echo "ComfyUI $version in $comfyui is ready."
echo "Skipped requirements: ${skipped[*]:-none}"
echo "Run: COMFYUI_DIR=$comfyui python -m pytest -q -s tests/test_comfy_integration.py"
