"""ssd-pipelines: Spatially Speculative Decoding for autoregressive image generators."""

from .backbones import ImageBackbone, ImageGrid, LlamaGridBackbone
from .decoding import ARDecoding, AutoDecoding, DecodeOutput, DecodeStats, ExactDecoding, SSDDecoding, make_strategy
from .heads import DraftHeads
from .pipeline_ssd import SSDAutoregressivePipeline, SSDPipelineOutput
from .sampling import ImageGenerators, SamplingConfig

__version__ = "0.1.0"

__all__ = [
    "ARDecoding",
    "AutoDecoding",
    "DecodeOutput",
    "DecodeStats",
    "DraftHeads",
    "ExactDecoding",
    "ImageBackbone",
    "ImageGenerators",
    "ImageGrid",
    "LlamaGridBackbone",
    "SSDAutoregressivePipeline",
    "SSDDecoding",
    "SSDPipelineOutput",
    "SamplingConfig",
    "make_strategy",
]
