"""Finding what a name points at, and loading it: a local folder or a Hub repository; a pipeline, drafting heads,
or the transformers checkpoint of a supported backbone (e.g. deepseek-community/Janus-Pro-7B).

Only the two small config files are fetched to tell the kinds apart; then just
the folders of the components that `model_index.json` names (or a checkpoint's
configs, tokenizer and safetensors) are downloaded, never pickled weights. Before anything is loaded, every component must have its
config and weights: transformers would otherwise build a default (7B) config for
a model whose config.json is missing. Hub failures are turned into errors that
say what to do. `SSDAutoregressivePipeline.from_pretrained` and `.load_heads` are thin wrappers over
`load_pipeline` and `heads_for`.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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
from safetensors import SafetensorError
from transformers import (
    AutoTokenizer,
    FeatureExtractionMixin,
    ImageProcessingMixin,
    PreTrainedTokenizerBase,
    ProcessorMixin,
)

from .backbones import model_class_for
from .heads import DraftHeads

if TYPE_CHECKING:
    from diffusers import VQModel
    from transformers import PreTrainedModel

    from .pipeline_ssd import SSDAutoregressivePipeline

HUB_MODEL = "ssd-pipelines/ssd-reference"
BUNDLED_MODEL = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"
HUB_OPTIONS = ("revision", "cache_dir", "local_files_only", "token")
DEVICE_MAP_OPTIONS = ("device_map", "max_memory", "offload_folder")  # accelerate, through transformers
HEADS_CLASS = DraftHeads.__name__
# What a damaged or mismatched weights file raises inside diffusers / transformers / safetensors.
WEIGHTS_FAULTS = (SafetensorError, OSError, RuntimeError, ValueError, json.JSONDecodeError)
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


def load_pipeline(
    cls: type[SSDAutoregressivePipeline], name_or_path: str | Path, heads, base_loader, **kwargs
) -> SSDAutoregressivePipeline:
    """`cls.from_pretrained` (its docstring says what it takes): `cls` builds the pipeline, so subclasses load as
    themselves; `base_loader` is diffusers' `DiffusionPipeline.from_pretrained` bound to `cls`, which reads a
    pipeline folder."""
    if kwargs.pop("use_safetensors", True) is not True:
        raise ValueError("SSD pipelines load only safetensors weights: drop use_safetensors (pickles are refused).")
    if kwargs.get("dtype") is None and kwargs.get("torch_dtype") is None:
        kwargs["dtype"] = torch.float32
    hub_options = {k: kwargs.pop(k) for k in HUB_OPTIONS if k in kwargs}
    placement = {k: kwargs.pop(k) for k in DEVICE_MAP_OPTIONS if k in kwargs}
    name = str(name_or_path)
    source = resolve_source(name, **hub_options)
    if source.kind == "heads":
        if heads is not None:
            raise ValueError(f"{name_or_path} is a heads repository: pass a pipeline with heads=..., not both.")
        heads = load_heads(source.location)
        if not heads.config.base_model:
            raise ValueError(f"the heads in {name_or_path} do not name their base model: pass it, with heads=.")
        hub_options.pop("revision", None)  # the revision was the heads'
        return cls.from_pretrained(heads.config.base_model, heads=heads, **hub_options, **placement, **kwargs)
    if source.kind == "checkpoint":
        pipe = _from_checkpoint(cls, Path(source.location), name, placement, **kwargs)
    else:
        pipe = _from_pipeline_folder(base_loader, Path(source.location), name, placement, **kwargs)
    pipe.register_to_config(_name_or_path=name)  # the name asked for, not the snapshot folder
    if placement:
        _place_beside_backbone(pipe)
    if heads is not None:
        pipe.load_heads(heads, **hub_options)
    return pipe


def heads_for(pipe: SSDAutoregressivePipeline, heads: DraftHeads | str | Path, **hub_options) -> DraftHeads:
    """`pipe.load_heads`: the heads, from a folder or repository if named, beside the backbone's last layer and
    checked to be made for it."""
    if not isinstance(heads, DraftHeads):
        source = resolve_source(str(heads), **hub_options)
        if source.kind != "heads":
            raise ValueError(f"heads={heads!r} is a pipeline, not drafting heads: pass a heads folder or repository.")
        heads = load_heads(source.location)
    backbone = pipe.image_backbone
    # torch's own `to`: diffusers 0.42's warns on every dtype cast that modules "should be kept in float32: []",
    # naming none (huggingface/diffusers#13872); heads keep no float32 modules.
    heads = torch.nn.Module.to(heads, device=backbone.device, dtype=pipe.backbone.dtype)
    heads.check_compatible(backbone)
    base = heads.config.base_model
    ours = pipe.config.get("_name_or_path")
    if base and ours and not Path(ours).exists() and base != ours:
        raise ValueError(
            f"these heads were trained for {base!r}, not for {ours!r}: load the heads trained for {ours!r}."
        )
    return heads


def _from_pipeline_folder(base_loader, folder: Path, name: str, placement: dict, **kwargs) -> SSDAutoregressivePipeline:
    check_components(folder, name)
    if placement and "backbone" not in kwargs:  # diffusers places whole components; a device map splits one
        library, class_name = pipeline_components(folder)["backbone"]
        model_class = getattr(importlib.import_module(library), class_name)
        kwargs["backbone"] = _load_model(model_class, folder / "backbone", name, _dtype(kwargs), placement)
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
    return pipe


def _from_checkpoint(
    cls, folder: Path, name: str, placement: dict, vqvae: VQModel | None = None, **kwargs
) -> SSDAutoregressivePipeline:
    """A pipeline around a supported backbone's transformers checkpoint: its model and tokenizer, its own VQ
    decoder (Janus-Pro, Emu3) or `vqvae` (Lumina-mGPT), no heads."""
    dtype = _dtype(kwargs)
    unknown = set(kwargs) - {"dtype", "torch_dtype"}
    if unknown:
        raise ValueError(f"unknown options for a transformers checkpoint: {sorted(unknown)}.")
    check_checkpoint(folder, name)
    model_class = model_class_for(read_json(folder / "config.json")["model_type"])
    backbone = _load_model(model_class, folder, name, dtype, placement)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return cls(backbone, tokenizer, None if vqvae is None else vqvae.to(dtype=dtype).eval())


def _place_beside_backbone(pipe: SSDAutoregressivePipeline) -> None:
    """Heads and VQ decoder on the device of the backbone's last layer, where their inputs are computed."""
    device = pipe.image_backbone.device
    for name in ("heads", "vqvae"):
        module = getattr(pipe, name)
        if module is not None:
            pipe.register_modules(**{name: module.to(device)})


def _dtype(kwargs: dict) -> torch.dtype:
    return kwargs.get("dtype") or kwargs.get("torch_dtype")


def _load_model(model_class, folder: Path, name: str, dtype: torch.dtype, placement: dict) -> PreTrainedModel:
    """A transformers model from safetensors, spread over devices by accelerate when `placement` has a device_map."""
    try:
        return model_class.from_pretrained(folder, dtype=dtype, use_safetensors=True, **placement).eval()
    except WEIGHTS_FAULTS as error:
        raise ValueError(
            f"could not load the backbone of {name}: {loading_error(error)}. Its weights must be readable "
            "safetensors files that match its config.json: re-download them (force_download=True)."
        ) from error


def read_json(path: Path) -> dict:
    """A config file's object; a damaged file names itself, which json's own errors do not."""
    try:
        config = json.loads(path.read_text())
    except ValueError as error:  # not JSON, or not UTF-8
        fault = f"is not valid JSON ({error})"
    else:
        if isinstance(config, dict):
            return config
        fault = f"holds a {type(config).__name__}, not a JSON object"
    raise ValueError(
        f"{path} {fault}: correct it, re-download it (force_download=True), or re-save the model with save_pretrained."
    )


def pipeline_components(folder: Path) -> dict[str, tuple[str, str]]:
    """The components `model_index.json` names: {name: (library, class name)}, optional ones left out."""
    index = read_json(folder / "model_index.json")
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


def config_files(cls: type) -> list[str]:
    """The config files one of which a component of class `cls` saves beside its weights; [] if we know none."""
    if issubclass(cls, ConfigMixin):
        return [cls.config_name]
    return next((files for base, files in COMPONENT_CONFIGS if issubclass(cls, base)), [])


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
