"""The frozen image backbone a trainer works on, loaded from a model name or folder."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from ..backbones import LlamaGridBackbone
from ..backbones.base import ImageBackbone
from ..pipeline_ssd import SSDAutoregressivePipeline


def load_image_backbone(
    model: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> ImageBackbone:
    """A frozen backbone from whatever `SSDAutoregressivePipeline.from_pretrained` loads (a pipeline, or a
    published backbone's transformers checkpoint such as deepseek-community/Janus-Pro-7B), or from a folder
    holding backbone/ (LlamaForCausalLM) and tokenizer/, as the reference trainer writes it."""
    folder = Path(model)
    if (folder / "backbone").is_dir() and not (folder / "model_index.json").is_file():
        llama = LlamaForCausalLM.from_pretrained(folder / "backbone", dtype=dtype).to(device).eval()
        llama.requires_grad_(False)
        return LlamaGridBackbone(llama, AutoTokenizer.from_pretrained(folder / "tokenizer"))
    pipe = SSDAutoregressivePipeline.from_pretrained(model, dtype=dtype).to(device)
    pipe.backbone.requires_grad_(False)
    return pipe.image_backbone
