"""Files to components: a pipeline folder through diffusers, a transformers checkpoint's backbone and tokenizer,
drafting heads, all from safetensors only; damaged weights (unreadable, mismatched, or not finite) give an error
that names the file and what to do.

`hub.py` finds the files a name points at; `pipeline_ssd.py` assembles a pipeline from what this module loads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .backbones import model_class_for
from .config_files import read_json
from .finite_weights import check_finite
from .heads import DraftHeads
from .hub import component_class, pipeline_components
from .quantization import check_runs_on_cpu, fit_nf4_to_cpu

# What a damaged or mismatched weights file raises inside diffusers / transformers / safetensors.
WEIGHTS_FAULTS = (SafetensorError, OSError, RuntimeError, ValueError, json.JSONDecodeError)


def _register_with_diffusers() -> None:
    """Let diffusers save, download and load our `DraftHeads` component as it does its own and transformers'.

    Without this, diffusers records a component from an unknown library under its module path and, loading
    from the Hub, looks for that module as a remote code file.
    """
    from diffusers.pipelines import pipeline_loading_utils as loading

    methods = {DraftHeads.__name__: ["save_pretrained", "from_pretrained"]}
    loading.LOADABLE_CLASSES.setdefault(__name__.split(".")[0], methods)
    loading.ALL_IMPORTABLE_CLASSES.update(methods)


_register_with_diffusers()


def load_pipeline_folder(base_loader, folder: Path, name: str, backbone_options: dict, **kwargs):
    """A pipeline folder through diffusers' `base_loader`; with `backbone_options` (a device map, a quantization
    config), the backbone first, by transformers (diffusers places whole components)."""
    given = set(kwargs)
    if backbone_options and "backbone" not in kwargs:
        model_class = component_class(name, "backbone", *pipeline_components(folder)["backbone"])
        kwargs["backbone"] = load_model(model_class, folder / "backbone", name, kwargs["dtype"], backbone_options)
    try:
        pipe = base_loader(folder, use_safetensors=True, **kwargs)
    except WEIGHTS_FAULTS as error:
        raise ValueError(
            f"could not load the pipeline {name}: {loading_error(error)}. Its weights must be readable "
            "safetensors files that match their config.json: re-download them (force_download=True) or "
            "re-save the pipeline."
        ) from error
    if pipe.heads is not None:
        check_heads_complete(pipe.heads, folder / "heads")
    check_runs_on_cpu(pipe.backbone, name)
    for component in ("backbone", "heads", "vqvae"):
        module = getattr(pipe, component)
        if component not in given and module is not None:
            check_finite(module, folder / component, f"{component} of {name}")
    return pipe


def load_checkpoint(
    folder: Path, name: str, dtype: torch.dtype, backbone_options: dict
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The backbone and tokenizer of a supported backbone's transformers checkpoint."""
    model_class = model_class_for(read_json(folder / "config.json")["model_type"])
    return load_model(model_class, folder, name, dtype, backbone_options), AutoTokenizer.from_pretrained(folder)


def load_model(model_class, folder: Path, name: str, dtype: torch.dtype, backbone_options: dict) -> PreTrainedModel:
    """A transformers model from safetensors; `backbone_options`: transformers' device_map (accelerate spreads it
    over devices), max_memory, offload_folder, quantization_config."""
    backbone_options = fit_nf4_to_cpu(model_class, folder, backbone_options, name)
    try:
        model = model_class.from_pretrained(folder, dtype=dtype, use_safetensors=True, **backbone_options).eval()
    except WEIGHTS_FAULTS as error:
        raise ValueError(
            f"could not load the backbone of {name}: {loading_error(error)}. Its weights must be readable "
            "safetensors files that match its config.json: re-download them (force_download=True)."
        ) from error
    check_finite(model, folder, f"backbone of {name}")
    check_runs_on_cpu(model, name)
    return model


def stored_dtype(folder: Path, kind: str) -> torch.dtype:
    """The dtype the backbone's weights are stored in (transformers' `dtype="auto"`), for every component; float32
    where its config.json does not say."""
    config = read_json(folder / "backbone" / "config.json" if kind == "pipeline" else folder / "config.json")
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    return getattr(torch, name)


def load_heads(folder: str | Path) -> DraftHeads:
    """Drafting heads from a folder, from safetensors only; damaged or incomplete weights say so."""
    if not any(Path(folder).glob("*.safetensors")):
        raise ValueError(
            f"the drafting heads in {folder} have a config.json but no weights (diffusion_pytorch_model.safetensors): "
            "a published heads repository without weights is not trained yet (see its model card); train them "
            "with ssd_pipelines.training.distill, or pass heads that have weights."
        )
    try:
        heads, info = DraftHeads.from_pretrained(folder, use_safetensors=True, output_loading_info=True)
    except WEIGHTS_FAULTS as error:
        raise ValueError(
            f"could not load drafting heads from {folder}: {loading_error(error)}. The heads need config.json and "
            "diffusion_pytorch_model.safetensors that match it; re-download them (force_download=True) or re-save them."
        ) from error
    check_heads_complete(heads, folder, missing=info["missing_keys"])
    check_finite(heads, folder, f"drafting heads in {folder}")
    return heads


def check_heads_complete(heads: DraftHeads, folder, missing: list[str] = ()) -> None:
    """Heads whose config promises more offsets than the weights hold are left half on `meta`: refuse them."""
    missing = sorted(set(missing) | {n for n, p in heads.named_parameters() if p.is_meta})
    if missing:
        raise ValueError(
            f"the drafting heads in {folder} are incomplete: their config.json describes weights the "
            f"safetensors file does not hold ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}). "
            "Re-download the heads, or re-save them with save_pretrained so config and weights agree."
        )


def loading_error(error: Exception) -> str:
    """A loader's message without its advice to pass `ignore_mismatched_sizes`, which would give random weights."""
    sentences = re.split(r"(?<=[.!])\s+", str(error).strip())
    advice = ("ignore_mismatched_sizes", "low_cpu_mem_usage", "For more information")
    return " ".join(s for s in sentences if not any(a in s for a in advice)).rstrip(". ")
