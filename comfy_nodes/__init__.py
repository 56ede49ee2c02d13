"""ComfyUI nodes for ssd-pipelines, on ComfyUI's V1 node API (NODE_CLASS_MAPPINGS); README.md says why.

ComfyUI imports this package from custom_nodes/ (directly, or through the repository's root __init__.py).
The nodes are thin: every decision about decoding is the library's (`ssd_pipelines`).
"""

import sys
from pathlib import Path

try:
    import ssd_pipelines  # noqa: F401
except ImportError as error:
    raise ImportError(
        f"the SSD nodes need the ssd-pipelines library in ComfyUI's Python: run "
        f"`{sys.executable} -m pip install -e {Path(__file__).resolve().parents[1]}`"
    ) from error

from .codes import SSDAcceptanceMap, SSDDecodeCodes
from .generate import SSDGenerate
from .loader import SSDPipelineLoader
from .model_folder import register_model_folder

register_model_folder()

NODE_CLASS_MAPPINGS = {
    "SSDPipelineLoader": SSDPipelineLoader,
    "SSDGenerate": SSDGenerate,
    "SSDDecodeCodes": SSDDecodeCodes,
    "SSDAcceptanceMap": SSDAcceptanceMap,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "SSDPipelineLoader": "SSD Pipeline Loader",
    "SSDGenerate": "SSD Generate",
    "SSDDecodeCodes": "SSD Decode Codes",
    "SSDAcceptanceMap": "SSD Acceptance Map",
}
