"""Stand-in for ComfyUI's `folder_paths.py`: model folders by name, as the SSD node pack registers and reads them.

`folder_names_and_paths[name]` is `(list of folders, set of file extensions)`; a name registered with
`add_model_folder_path` starts with an empty extension set. Tests point `models_dir` at a temporary folder
before loading the pack.
"""

from __future__ import annotations

import os

models_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
folder_names_and_paths: dict[str, tuple[list[str], set[str]]] = {}


def add_model_folder_path(folder_name: str, full_folder_path: str, is_default: bool = False) -> None:
    if folder_name not in folder_names_and_paths:
        folder_names_and_paths[folder_name] = ([full_folder_path], set())
        return
    paths = folder_names_and_paths[folder_name][0]
    if full_folder_path in paths:
        if is_default:  # an existing folder only moves, to the front
            paths.remove(full_folder_path)
            paths.insert(0, full_folder_path)
    elif is_default:
        paths.insert(0, full_folder_path)
    else:
        paths.append(full_folder_path)


def get_folder_paths(folder_name: str) -> list[str]:
    return folder_names_and_paths[folder_name][0][:]
