"""ssd-pipelines: Spatially Speculative Decoding for autoregressive image generators.

The names below are imported on first use (PEP 562, as diffusers and transformers do), so that importing a light
submodule, such as the command lines' argument parsers, does not load torch, diffusers and transformers.
"""

import importlib

from .backend_logs import quiet_backend_imports

quiet_backend_imports()  # before any module of ours imports transformers or diffusers

__version__ = "0.1.0"

_EXPORTS = {  # name: the module that defines it
    "ARDecoding": ".decoding",
    "AutoDecoding": ".decoding",
    "DecodeOutput": ".decoding",
    "DecodeStats": ".decoding",
    "DraftHeads": ".heads",
    "ExactDecoding": ".decoding",
    "ImageBackbone": ".backbones",
    "ImageGenerators": ".sampling",
    "ImageGrid": ".backbones",
    "LlamaGridBackbone": ".backbones",
    "SSDAutoregressivePipeline": ".pipeline_ssd",
    "SSDDecoding": ".decoding",
    "SSDGlmImagePipeline": ".pipeline_glm_image",
    "SSDGlmImagePipelineOutput": ".pipeline_glm_image",
    "SSDPipelineOutput": ".pipeline_ssd",
    "SamplingConfig": ".sampling_config",
    "make_strategy": ".decoding",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
