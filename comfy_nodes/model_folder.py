"""ComfyUI's models/ssd/ folder: where users put SSD pipelines, plus the reference model this repository ships.

An SSD pipeline is a folder (diffusers layout), not one file, so the listing walks the folders the way
ComfyUI's own DiffusersLoader does, instead of `folder_paths.get_filename_list`, which lists files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import folder_paths

from ssd_pipelines.hub import HEADS_CLASS

FOLDER = "ssd"
BUNDLED_NAME = "ssd-reference"
MAX_DEPTH = 4  # models/ssd/a/b/c/model: folders deeper down are not searched
# The pack's own copy, not ssd_pipelines.hub.BUNDLED_MODEL: a registry install puts the library in site-packages,
# without hub_cards/, while the pack's folder (this clone) always has it.
BUNDLED_MODEL = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"


def register_model_folder() -> None:
    """Add models/ssd/ to ComfyUI's model folders (extra_model_paths.yaml may add more under the key `ssd`)."""
    folder_paths.add_model_folder_path(FOLDER, os.path.join(folder_paths.models_dir, FOLDER))


def models_folders() -> list[str]:
    return folder_paths.get_folder_paths(FOLDER)


def is_model(folder: str | Path) -> bool:
    """A pipeline (model_index.json), or drafting heads whose config.json the library reads (they name their base)."""
    folder = Path(folder)
    if (folder / "model_index.json").is_file():
        return True
    config = folder / "config.json"
    try:
        return config.is_file() and json.loads(config.read_text()).get("_class_name") == HEADS_CLASS
    except (OSError, json.JSONDecodeError):
        return False


def list_models() -> list[str]:
    """Every model under the ssd folders, as a path relative to its folder; then the bundled reference model."""
    names = [name for root in models_folders() for name in _models_under(Path(root))]
    if BUNDLED_MODEL.is_dir() and BUNDLED_NAME not in names:
        names.append(BUNDLED_NAME)
    return list(dict.fromkeys(names))


def _models_under(root: Path) -> list[str]:
    """The model folders under `root`, at most `MAX_DEPTH` folders down, in name order.

    A link to a model folder is listed (a model kept on another disk), but the search goes through a link only
    while it stays inside `root`, and never into a folder it has seen: links that point back up (`a/up -> ..`)
    made `os.walk(followlinks=True)` walk for ever.
    """
    inside, seen, found = root.resolve(), set(), []

    def search(folder: Path, depth: int) -> None:
        real = folder.resolve()
        if real in seen:
            return
        seen.add(real)
        try:
            children = sorted(folder.iterdir(), key=lambda p: p.name)
        except OSError:  # unreadable: nothing to list there
            return
        for child in children:
            if not child.is_dir():
                continue
            if is_model(child):
                found.append(child.relative_to(root).as_posix())  # its heads/ folder is part of it
            elif depth < MAX_DEPTH and child.resolve().is_relative_to(inside):
                search(child, depth + 1)

    if root.is_dir():
        search(root, 1)
    return found


def locate(name: str) -> str | None:
    """The folder a name from `list_models` stands for, or None when it names none."""
    for root in models_folders():
        candidate = Path(root) / name
        if name and candidate.is_dir() and is_model(candidate):
            return str(candidate)
    if name == BUNDLED_NAME and BUNDLED_MODEL.is_dir():
        return str(BUNDLED_MODEL)
    return None
