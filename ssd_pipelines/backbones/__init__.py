"""Backbone adapters: one per model family, behind the `ImageBackbone` contract."""

from transformers import LlamaForCausalLM, PreTrainedModel

from .base import ImageBackbone, ImageGrid, KVState, PromptBatch
from .causal_lm import CausalLMBackbone
from .llama_grid import GridTokens, LlamaGridBackbone

ADAPTERS: dict[type[PreTrainedModel], type[ImageBackbone]] = {
    LlamaForCausalLM: LlamaGridBackbone,
}


def adapter_for(model: PreTrainedModel, tokenizer, vqvae=None) -> ImageBackbone:
    """The adapter that speaks the backbone contract for this transformers model."""
    for model_class, adapter in ADAPTERS.items():
        if isinstance(model, model_class):
            return adapter.from_components(model, tokenizer, vqvae)
    supported = ", ".join(cls.__name__ for cls in ADAPTERS)
    raise ValueError(f"no SSD adapter for {type(model).__name__}: supported backbones are {supported}.")


__all__ = [
    "ADAPTERS",
    "CausalLMBackbone",
    "GridTokens",
    "ImageBackbone",
    "ImageGrid",
    "KVState",
    "LlamaGridBackbone",
    "PromptBatch",
    "adapter_for",
]
