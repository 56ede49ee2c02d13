"""Backbone adapters: one per model family, behind the `ImageBackbone` contract."""

from transformers import (
    ChameleonForConditionalGeneration,
    Emu3ForConditionalGeneration,
    GlmImageForConditionalGeneration,
    JanusForConditionalGeneration,
    LlamaForCausalLM,
    PreTrainedModel,
)

from .base import ImageBackbone, ImageGrid, KVState, PromptBatch
from .causal_lm import CausalLMBackbone
from .emu3 import Emu3Backbone
from .glm_image import GlmImageBackbone, GlmImagePromptBatch
from .janus import JanusProBackbone
from .llama_grid import GridTokens, LlamaGridBackbone
from .lumina_mgpt import LuminaMGPTBackbone

ADAPTERS: dict[type[PreTrainedModel], type[ImageBackbone]] = {
    LlamaForCausalLM: LlamaGridBackbone,
    JanusForConditionalGeneration: JanusProBackbone,
    Emu3ForConditionalGeneration: Emu3Backbone,
    ChameleonForConditionalGeneration: LuminaMGPTBackbone,
    GlmImageForConditionalGeneration: GlmImageBackbone,
}


def adapter_for(model: PreTrainedModel, tokenizer, vqvae=None) -> ImageBackbone:
    """The adapter that speaks the backbone contract for this transformers model."""
    for model_class, adapter in ADAPTERS.items():
        if isinstance(model, model_class):
            return adapter.from_components(model, tokenizer, vqvae)
    supported = ", ".join(cls.__name__ for cls in ADAPTERS)
    raise ValueError(f"no SSD adapter for {type(model).__name__}: supported backbones are {supported}.")


def model_class_for(model_type: str) -> type[PreTrainedModel] | None:
    """The transformers class of a checkpoint's `config.json` model_type when its adapter wraps such a
    checkpoint as it is published (`ImageBackbone.wraps_checkpoints`), else None."""
    for model_class, adapter in ADAPTERS.items():
        if adapter.wraps_checkpoints and model_class.config_class.model_type == model_type:
            return model_class
    return None


__all__ = [
    "ADAPTERS",
    "CausalLMBackbone",
    "Emu3Backbone",
    "GlmImageBackbone",
    "GlmImagePromptBatch",
    "GridTokens",
    "ImageBackbone",
    "ImageGrid",
    "JanusProBackbone",
    "KVState",
    "LlamaGridBackbone",
    "LuminaMGPTBackbone",
    "PromptBatch",
    "adapter_for",
    "model_class_for",
]
