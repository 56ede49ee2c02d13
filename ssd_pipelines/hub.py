"""Finding what a name points at: a local folder or a Hub repository, a pipeline or drafting heads.

Only the two small config files are fetched to tell the kinds apart; diffusers
then downloads just the files a pipeline's components need. Hub failures are
turned into errors that say what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from safetensors import SafetensorError

from .heads import DraftHeads

HEADS_CLASS = DraftHeads.__name__
WEIGHTS_FAULTS = (SafetensorError, OSError, RuntimeError, json.JSONDecodeError)


@dataclass(frozen=True)
class Source:
    kind: str  # "pipeline" or "heads"
    location: str  # a local folder, or a Hub repository id diffusers downloads from


def resolve_source(name_or_path: str, **hub_options) -> Source:
    """Tell a pipeline from heads, fetching at most `model_index.json` and `config.json` from the Hub."""
    folder = Path(name_or_path)
    if folder.is_dir():
        return Source(_kind_of(folder, name_or_path), str(folder))
    probed = Path(_download(name_or_path, ["model_index.json", "config.json"], **hub_options))
    kind = _kind_of(probed, name_or_path)
    if kind == "heads":
        return Source(kind, _download(name_or_path, ["config.json", "*.safetensors"], **hub_options))
    return Source(kind, name_or_path)


def load_heads(folder: str | Path) -> DraftHeads:
    """Drafting heads from a folder, from safetensors only; a damaged file says so."""
    try:
        return DraftHeads.from_pretrained(folder, use_safetensors=True)
    except WEIGHTS_FAULTS as error:
        raise ValueError(
            f"could not load drafting heads from {folder}: {error}. The heads need config.json and "
            "diffusion_pytorch_model.safetensors; re-download them (force_download=True) or re-save them."
        ) from error


def _kind_of(folder: Path, name: str) -> str:
    if (folder / "model_index.json").is_file():
        return "pipeline"
    config = folder / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("_class_name") == HEADS_CLASS:
        return "heads"
    raise ValueError(
        f"{name} is neither an SSD pipeline (no model_index.json) nor drafting heads "
        f"(no config.json of {HEADS_CLASS}): pass a pipeline folder or repository, or heads whose config names their base model."
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
            f"{repo_id!r} is not in the local Hugging Face cache and the Hub cannot be reached (offline, "
            "HF_HUB_OFFLINE=1 or local_files_only=True): download it once while online "
            f"(`hf download {repo_id}`), or pass a local folder."
        ) from error
