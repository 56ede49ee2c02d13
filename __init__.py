"""ComfyUI's entry point when this repository is cloned into ComfyUI/custom_nodes/: the node pack is comfy_nodes/.

ComfyUI imports this file as a package, with its own modules (`folder_paths`, `comfy`) importable. pytest
imports it too, because the repository root holds an __init__.py: as a plain module, or as a package named
after the checkout's folder, and without ComfyUI. Only inside ComfyUI is there a pack to load.
"""

import importlib.util

if __package__ and importlib.util.find_spec("folder_paths") is not None:
    from .comfy_nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
