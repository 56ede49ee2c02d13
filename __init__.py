"""ComfyUI's entry point when this repository is cloned into ComfyUI/custom_nodes/: the node pack is comfy_nodes/.

ComfyUI imports this file as a package. pytest imports it too, as a plain module named "__init__" (the
repository root holds an __init__.py, so pytest sees a package), where a relative import cannot work.
"""

if __package__:
    from .comfy_nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
