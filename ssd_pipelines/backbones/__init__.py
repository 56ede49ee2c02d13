"""Backbone adapters: one per model family, behind the `ImageBackbone` contract."""

from .base import ImageBackbone, ImageGrid, KVState, PromptBatch
from .causal_lm import CausalLMBackbone
from .llama_grid import GridTokens, LlamaGridBackbone

__all__ = ["CausalLMBackbone", "GridTokens", "ImageBackbone", "ImageGrid", "KVState", "LlamaGridBackbone", "PromptBatch"]
