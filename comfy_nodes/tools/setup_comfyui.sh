#!/usr/bin/env bash
# Prepare a ComfyUI source folder for tests/test_comfy_integration.py, or for trying the pack by hand:
# a virtual environment in <ComfyUI>/.venv with torch, ComfyUI's requirements and this repository (editable).
#
#   git clone https://github.com/Comfy-Org/ComfyUI /path/to/ComfyUI
#   comfy_nodes/tools/setup_comfyui.sh /path/to/ComfyUI
#   COMFYUI_DIR=/path/to/ComfyUI python -m pytest -q -s tests/test_comfy_integration.py
#
# TORCH_PACKAGES is the torch build, the only source of torch, torchvision and torchaudio: their lines in
# ComfyUI's requirements are left out, so that a torchaudio pinned to another torch cannot replace it.
# Default "torch torchvision torchaudio" (whatever pip resolves), e.g.
#   TORCH_PACKAGES="torch torchvision torchaudio --index-url https://download.pytorch.org/whl/cpu"
# ComfyUI starts and runs this pack without torchaudio (only its audio nodes fail to import), which is what CI
# uses: TORCH_PACKAGES="torch==2.14.1 torchvision==0.29.1".
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

requirements=()
while IFS= read -r line; do
  requirement="${line%%#*}"
  requirement="${requirement//[[:space:]]/}"
  [[ -z "$requirement" || "$requirement" =~ ^(torch|torchvision|torchaudio)([^a-zA-Z0-9_.-]|$) ]] && continue
  requirements+=("$requirement")
done < "$comfyui/requirements.txt"
skipped=()
if ! "${pip[@]}" install "${requirements[@]}"; then
  for requirement in "${requirements[@]}"; do
    "${pip[@]}" install "$requirement" || skipped+=("$requirement")
  done
fi
"${pip[@]}" install -e "$repo"

version="$(cd "$comfyui" && .venv/bin/python -c 'import comfyui_version; print(comfyui_version.__version__)' 2>/dev/null || echo unknown)"
echo "ComfyUI $version in $comfyui is ready."
echo "Skipped requirements: ${skipped[*]:-none}"
echo "Run: COMFYUI_DIR=$comfyui python -m pytest -q -s tests/test_comfy_integration.py"
