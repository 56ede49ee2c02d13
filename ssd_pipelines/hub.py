"""Finding what a name points at: a local folder or a Hub repository; a pipeline, drafting heads, or the
transformers checkpoint of a supported backbone (e.g. deepseek-community/Janus-Pro-7B).

Only the two small config files are fetched to tell the kinds apart; then just
the folders of the components that `model_index.json` names (or a checkpoint's
configs, tokenizer and safetensors) are downloaded, never pickled weights. Before anything is loaded, every component must have its
config and weights: transformers would otherwise build a default (7B) config for
a model whose config.json is missing. Hub failures are turned into errors that
say what to do.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id
from safetensors import SafetensorError

from .backbones import model_class_for
from .heads import DraftHeads

HEADS_CLASS = DraftHeads.__name__
# What a damaged or mismatched weights file raises inside diffusers / transformers / safetensors.
WEIGHTS_FAULTS = (SafetensorError, OSError, RuntimeError, ValueError, json.JSONDecodeError)
PICKLED_WEIGHTS = ["*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle", "*.msgpack", "*.h5"]
# A transformers checkpoint: configs, sharded safetensors and their index, tokenizer files, chat templates.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]


@dataclass(frozen=True)
class Source:
    kind: str  # "pipeline", "heads" or "checkpoint" (a supported backbone's transformers checkpoint)
    location: str  # a local folder holding the files


def resolve_source(name_or_path: str, **hub_options) -> Source:
    """Tell a pipeline from heads, fetching at most `model_index.json` and `config.json` from the Hub to do so,
    then the files the pipeline's components or the heads need."""
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return Source(_kind_of(folder, name_or_path), str(folder))
    _check_hub_name(name_or_path, folder)
    probed = Path(_download(name_or_path, ["model_index.json", "config.json"], **hub_options))
    kind = _kind_of(probed, name_or_path)
    if kind == "heads":
        return Source(kind, _download(name_or_path, ["config.json", "*.safetensors"], **hub_options))
    if kind == "checkpoint":
        return Source(kind, _download(name_or_path, CHECKPOINT_FILES, **hub_options))
    components = [f"{name}/*" for name in pipeline_components(probed)]
    return Source(kind, _download(name_or_path, ["model_index.json", *components], **hub_options))


def pipeline_components(folder: Path) -> dict[str, tuple[str, str]]:
    """The components `model_index.json` names: {name: (library, class name)}, optional ones left out."""
    index = json.loads((folder / "model_index.json").read_text())
    return {
        name: tuple(value)
        for name, value in index.items()
        if not name.startswith("_") and isinstance(value, list) and len(value) == 2 and None not in value
    }


def check_components(folder: Path, name: str) -> None:
    """Raise, naming the missing file, unless every component has its config and (models) safetensors weights."""
    for component, (library, class_name) in pipeline_components(folder).items():
        where = folder / component
        cls = getattr(importlib.import_module(library), class_name, None)
        if cls is None:
            raise ValueError(
                f"could not load the pipeline {name}: model_index.json names {library}.{class_name} for "
                f"'{component}', which this version of {library} does not have: upgrade {library}."
            )
        is_model = issubclass(cls, torch.nn.Module)
        configs = ["config.json"] if is_model else ["tokenizer_config.json", "tokenizer.json", "config.json"]
        if not any((where / config).is_file() for config in configs):
            raise ValueError(
                f"could not load the pipeline {name}: {where / configs[0]} is missing ('{component}' needs it). "
                "Re-download the pipeline, or re-save it with save_pretrained."
            )
        if is_model and not any(where.glob("*.safetensors")):
            pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in where.glob(pattern))
            raise ValueError(
                f"could not load the pipeline {name}: '{component}' has no safetensors weights in {where}"
                + (f" (only {', '.join(pickled)}: pickled checkpoints are never loaded)" if pickled else "")
                + ". Re-download the pipeline, or load the component and re-save it with save_pretrained."
            )


def check_checkpoint(folder: Path, name: str) -> None:
    """Raise unless a transformers checkpoint has safetensors weights (pickled ones are never loaded)."""
    if not any(folder.glob("*.safetensors")):
        pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern))
        raise ValueError(
            f"could not load {name}: {folder} has no safetensors weights"
            + (f" (only {', '.join(pickled)}: pickled checkpoints are never loaded)" if pickled else "")
            + ". Use a revision of the checkpoint that has safetensors, or convert it once and pass the folder."
        )


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


def _check_hub_name(name: str, folder: Path) -> None:
    """A name that cannot be a Hub repository, or names a file, is a local path that is not a folder."""
    if folder.is_file():
        raise ValueError(
            f"{name} is a file: pass the folder that holds model_index.json (a pipeline) or config.json (heads)."
        )
    looks_local = name.startswith((".", "/", "~")) or "\\" in name
    try:
        validate_repo_id(name)
    except HFValidationError:
        looks_local = True
    if looks_local or name.count("/") > 1:
        raise ValueError(f"no such folder: {name}. Pass an existing pipeline or heads folder, or a Hub id 'org/name'.")


def _kind_of(folder: Path, name: str) -> str:
    if (folder / "model_index.json").is_file():
        return "pipeline"
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    if config.get("_class_name") == HEADS_CLASS:
        return "heads"
    if model_class_for(config.get("model_type", "")) is not None:
        return "checkpoint"
    raise ValueError(
        f"{name} is neither an SSD pipeline (no model_index.json), drafting heads (no config.json of {HEADS_CLASS}) "
        "nor the transformers checkpoint of a supported backbone (Janus-Pro, Emu3, Lumina-mGPT): pass a pipeline "
        "folder or repository, heads whose config names their base model, or such a checkpoint."
    )


def _download(repo_id: str, patterns: list[str], **hub_options) -> str:
    try:
        return snapshot_download(repo_id, allow_patterns=patterns, **hub_options)
    except RepositoryNotFoundError as error:
        raise ValueError(
            f"{repo_id!r} is neither a local folder nor a Hub repository we can see: check the name, "
            "or pass token=... if it is private."
        ) from error
    except RevisionNotFoundError as error:
        raise ValueError(
            f"{repo_id!r} has no revision {hub_options.get('revision')!r}: pass an existing branch, tag or commit."
        ) from error
    except (LocalEntryNotFoundError, EntryNotFoundError) as error:
        raise ValueError(
            f"{repo_id!r} is no local folder, is not in the local Hugging Face cache, and the Hub cannot be reached (offline, "
            "HF_HUB_OFFLINE=1 or local_files_only=True): download it once while online "
            f"(`hf download {repo_id}`), or pass a local folder."
        ) from error
