"""Stand-ins for the ComfyUI modules the node pack imports (`comfy.utils`, `comfy.model_management`,
`folder_paths`), with ComfyUI's signatures, and a loader that imports a custom-node folder as ComfyUI does.

ComfyUI is not on PyPI, so CI cannot install it; tests/test_comfy_integration.py checks the same pack against a
real ComfyUI when COMFYUI_DIR is set, and compares these schemas with the real server's /object_info.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

STUBS = Path(__file__).resolve().parent
REPO = STUBS.parents[1]


def load_custom_node(folder: Path) -> ModuleType:
    """Import `folder/__init__.py` as ComfyUI's `nodes.load_custom_node` does: a spec made from the file, named
    after the folder's path (dots replaced), registered in sys.modules first so relative imports resolve."""
    name = str(folder).replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
