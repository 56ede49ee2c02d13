"""Names to files: what a name points at (a local folder or a Hub repository; a pipeline, drafting heads, or the
transformers checkpoint of a supported backbone, e.g. deepseek-community/Janus-Pro-7B), and its files on disk.

Only the two small config files are fetched to tell the kinds apart; then just the folders of the components that
`model_index.json` names (or a checkpoint's configs, tokenizer and safetensors) are downloaded, never pickled
weights. Before anything is loaded, every component must have its config and weights: transformers would otherwise
build a default (7B) config for a model whose config.json is missing. Hub failures are turned into errors that say
what to do. Loading the files is `loading.py`'s job; assembling a pipeline from them, `pipeline_ssd.py`'s.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers.configuration_utils import ConfigMixin
from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id
from transformers import (
    FeatureExtractionMixin,
    ImageProcessingMixin,
    PreTrainedTokenizerBase,
    ProcessorMixin,
)

from .backbones import model_class_for
from .config_files import check_json_files, check_model_config, read_json
from .heads import DraftHeads

HUB_MODEL = "ssd-pipelines/ssd-reference"
BUNDLED_MODEL = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"
HUB_OPTIONS = ("revision", "cache_dir", "local_files_only", "token", "force_download")
HEADS_CLASS = DraftHeads.__name__
# The libraries a pipeline folder's components may come from. `model_index.json` ships with the model and importing a
# module runs it, so no other name it gives is imported: a downloaded "model" must not be code (diffusers'
# `_get_library_or_raise` holds the same line).
COMPONENT_LIBRARIES = ("ssd_pipelines", "transformers", "diffusers")
PICKLED_WEIGHTS = ["*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle", "*.msgpack", "*.h5"]
# A transformers checkpoint: configs, sharded safetensors and their index, tokenizer files, chat templates.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
# The config files a component saves, one of which its folder must hold (the first is named when none is), for
# transformers' kinds and torch models; diffusers' components (models, schedulers) name theirs in `config_name`.
COMPONENT_CONFIGS = (
    (PreTrainedTokenizerBase, ["tokenizer_config.json", "tokenizer.json", "config.json"]),
    ((FeatureExtractionMixin, ImageProcessingMixin), ["preprocessor_config.json"]),
    (ProcessorMixin, ["processor_config.json", "preprocessor_config.json"]),
    (torch.nn.Module, ["config.json"]),
)


def default_model() -> str:
    """The reference model shipped in this repository when installed from it, else its Hub repository."""
    return str(BUNDLED_MODEL) if (BUNDLED_MODEL / "model_index.json").is_file() else HUB_MODEL


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
    index = read_json(folder / "model_index.json")
    return {
        name: tuple(value)
        for name, value in index.items()
        if not name.startswith("_") and isinstance(value, list) and len(value) == 2 and None not in value
    }


def component_class(name: str, component: str, library: str, class_name: str) -> type:
    """The class `model_index.json` names for `component` of the pipeline `name`, imported only from
    `COMPONENT_LIBRARIES`."""
    if library not in COMPONENT_LIBRARIES:
        raise ValueError(
            f"could not load the pipeline {name}: its model_index.json names the module {library!r} for "
            f"'{component}', and components load only from {', '.join(COMPONENT_LIBRARIES)}. A model folder's "
            "files are never run as code: re-save the pipeline with save_pretrained, or pass the component itself "
            f"(from_pretrained(..., {component}=...))."
        )
    cls = getattr(importlib.import_module(library), class_name, None)
    if not isinstance(cls, type):
        raise ValueError(  # noqa: TRY004 (the file's fault, not the caller's type)
            f"could not load the pipeline {name}: model_index.json names {library}.{class_name} for "
            f"'{component}', which this version of {library} does not have as a class: upgrade {library}, or "
            "re-save the pipeline with save_pretrained."
        )
    return cls


def check_components(folder: Path, name: str) -> None:
    """Raise, naming the missing file, unless every component comes from a library we load from and has its config
    and (models) safetensors weights."""
    _check_pipeline_class(folder, name)
    components = pipeline_components(folder)
    classes = {component: component_class(name, component, *named) for component, named in components.items()}
    for component, cls in classes.items():
        where = folder / component
        if where.is_dir():
            check_json_files(where)
        is_model = issubclass(cls, torch.nn.Module)
        configs = config_files(cls)
        if configs and not any((where / config).is_file() for config in configs):
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
        if is_model and cls is not DraftHeads:  # the heads' loader checks them against their config itself
            check_model_config(where, cls, component)


def _check_pipeline_class(folder: Path, name: str) -> None:
    """A `_class_name` of [module, class] asks diffusers to run the folder's own code: refused by name."""
    named = read_json(folder / "model_index.json").get("_class_name")
    if isinstance(named, list):
        module = named[0] if named else None
        raise ValueError(  # noqa: TRY004 (the file's fault, not the caller's type)
            f"could not load the pipeline {name}: its model_index.json asks for the custom pipeline code "
            f"{module}.py in the folder ({named!r} as _class_name), and a model folder's files are never run as "
            'code. Set "_class_name" to "SSDAutoregressivePipeline", or re-save the pipeline with save_pretrained.'
        )


def config_files(cls: type) -> list[str]:
    """The config files one of which a component of class `cls` saves beside its weights; [] if we know none."""
    if issubclass(cls, ConfigMixin):
        return [cls.config_name]
    return next((files for base, files in COMPONENT_CONFIGS if issubclass(cls, base)), [])


def check_checkpoint(folder: Path, name: str) -> None:
    """Raise unless a transformers checkpoint has readable JSON files and safetensors weights (pickled ones are
    never loaded) that match its config."""
    check_json_files(folder)
    if not any(folder.glob("*.safetensors")):
        pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern))
        raise ValueError(
            f"could not load {name}: {folder} has no safetensors weights"
            + (f" (only {', '.join(pickled)}: pickled checkpoints are never loaded)" if pickled else "")
            + ". Use a revision of the checkpoint that has safetensors, or convert it once and pass the folder."
        )
    check_model_config(folder, model_class_for(read_json(folder / "config.json")["model_type"]), "backbone")


def check_hub_base_model(repo_id: str, base_model: str) -> None:
    """A heads repository downloaded from the Hub may name only another Hub repository as its base model, never a
    folder of this machine, which its author cannot know and should not choose."""
    try:
        validate_repo_id(base_model)
    except HFValidationError:
        local = True
    else:
        local = base_model.startswith((".", "~")) or base_model.count("/") != 1
    if local:
        raise ValueError(
            f"the heads repository {repo_id} names {base_model!r} as its base model, which is not a Hub repository "
            "id: a downloaded repository may not point at this machine's files. Load the base pipeline yourself "
            f"and pass the heads: from_pretrained(BASE, heads={repo_id!r})."
        )


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
    config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
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
