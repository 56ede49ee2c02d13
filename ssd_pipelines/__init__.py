"""ssd-pipelines: Spatially Speculative Decoding for autoregressive image generators."""

from .backbones import ImageBackbone, ImageGrid, LlamaGridBackbone
from .decoding import ARDecoding, DecodeOutput, DecodeStats, ExactDecoding, SSDDecoding, make_strategy
from .heads import DraftHeads
from .sampling import SamplingConfig

__version__ = "0.1.0"

__all__ = [
    "ARDecoding",
    "DecodeOutput",
    "DecodeStats",
    "DraftHeads",
    "ExactDecoding",
    "ImageBackbone",
    "ImageGrid",
    "LlamaGridBackbone",
    "SSDDecoding",
    "SamplingConfig",
    "make_strategy",
]
