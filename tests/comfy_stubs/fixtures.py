"""Fixtures for the node pack's tests: the pack loaded over the stand-ins, ComfyUI's progress hook, Cancel."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import pytest

from . import REPO, STUBS, load_custom_node


@pytest.fixture(scope="session")
def comfy_pack(tmp_path_factory) -> ModuleType:
    """The repository loaded as a custom-node folder, as `git clone` into ComfyUI/custom_nodes/ leaves it,
    with ComfyUI's models folder in a temporary directory."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(STUBS))
        import folder_paths

        patch.setattr(folder_paths, "models_dir", str(tmp_path_factory.mktemp("comfyui") / "models"))
        yield load_custom_node(REPO)


@pytest.fixture
def ssd_models(comfy_pack) -> Path:
    """ComfyUI/models/ssd/, emptied after the test."""
    import folder_paths

    folder = Path(folder_paths.get_folder_paths("ssd")[0])
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@pytest.fixture
def progress_calls(comfy_pack) -> list[tuple]:
    """What ComfyUI's server would receive from progress bars made during the test: (value, total, preview)."""
    import comfy.utils

    calls: list[tuple] = []
    comfy.utils.set_progress_bar_global_hook(
        lambda value, total, preview, node_id=None: calls.append((value, total, preview))
    )
    yield calls
    comfy.utils.set_progress_bar_global_hook(None)


@pytest.fixture
def comfy_interrupt(comfy_pack):
    """comfy.model_management, with the interrupt flag cleared before and after the test."""
    import comfy.model_management

    comfy.model_management.interrupt_current_processing(False)
    yield comfy.model_management
    comfy.model_management.interrupt_current_processing(False)
