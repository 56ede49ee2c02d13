"""A model folder's JSON files, read and checked before any weight loads.

transformers and diffusers build a model from whatever its config.json says: a size given as a string or as -1
ends in a traceback from deep inside them, and a size that does not match the weights in transformers' "look at the
above report". Here every JSON file of a component must parse, the sizes that shape a model must be positive
integers, the model must build from its config (on the meta device: no memory), and the shapes it gives its weights
must be those its safetensors files hold. A fault names the file and the key, and says what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

FIX = "correct it, re-download it (force_download=True), or re-save the model with save_pretrained"
# The sizes that shape a model (transformers' decoders and their sub-configs, diffusers' VQModel): positive ints.
SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "num_vq_embeddings",
    "vq_embed_dim",
    "latent_channels",
    "in_channels",
    "out_channels",
    "sample_size",
    "norm_num_groups",
    "layers_per_block",
)
WEIGHTS_INDEX = "*.safetensors.index.json"  # sharded weights: which file holds each tensor


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
    raise ValueError(f"{path} {fault}: {FIX}.")


def check_json_files(folder: Path) -> None:
    """Every JSON file of a component's folder (configs, a tokenizer's files, a weights index) must parse, and a
    weights index may name only files inside the folder."""
    for path in sorted(folder.glob("*.json")):
        config = read_json(path)
        if path.match(WEIGHTS_INDEX):
            _check_weights_index(path, config)


def check_model_config(folder: Path, cls: type, what: str) -> None:
    """Raise, naming `folder`'s config.json and the key, unless a `cls` (a transformers or diffusers model) builds
    from it with the shapes its safetensors weights hold. `what` names the component in the message."""
    path = folder / "config.json"
    config = read_json(path)
    _check_sizes(path, config)
    try:
        with torch.device("meta"):
            model = _build(cls, config)
    except Exception as error:  # whatever the library raised, the file is at fault
        reason = str(error).strip().splitlines()[-1].strip() if str(error).strip() else type(error).__name__
        raise ValueError(f"{path} does not describe a {cls.__name__} ({reason}): {FIX}.") from error
    if config.get("quantization_config") is None:  # quantized weights are stored in their backend's own layout
        _check_shapes(path, config, model, what)


def _build(cls: type, config: dict) -> torch.nn.Module:
    from transformers import PreTrainedModel

    if issubclass(cls, PreTrainedModel):
        return cls(cls.config_class.from_dict(config))
    return cls.from_config(config)


def _check_sizes(path: Path, config: dict, where: str = "") -> None:
    for key, value in config.items():
        if isinstance(value, dict):
            _check_sizes(path, value, f"{where}{key}.")
        elif (
            key in SIZE_KEYS
            and value is not None
            and (isinstance(value, bool) or not isinstance(value, int) or value < 1)
        ):
            raise ValueError(f"{path}: {where}{key} must be a positive integer, got {value!r}: {FIX}.")


def _check_weights_index(path: Path, index: dict) -> None:
    for file in sorted(set((index.get("weight_map") or {}).values())):
        if not isinstance(file, str) or Path(file).name != file or file.startswith("."):
            raise ValueError(
                f"{path} names {file!r} as a weights file: an index may name only files beside it, in "
                f"{path.parent}: {FIX}."
            )


def _stored_shapes(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (file name, shape)} from the safetensors headers alone."""
    shapes = {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(file, "pt") as weights:
                for key in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    shapes[key] = (file.name, tuple(weights.get_slice(key).get_shape()))
        except (SafetensorError, OSError) as error:
            raise ValueError(
                f"{file} is not a readable safetensors file ({error}): re-download it (force_download=True)."
            ) from error
    return shapes


def _check_shapes(path: Path, config: dict, model: torch.nn.Module, what: str) -> None:
    stored = _stored_shapes(path.parent)
    tensors = model.state_dict(keep_vars=True)
    built = {key: tuple(tensor.shape) for key, tensor in tensors.items()}
    for key in sorted(stored.keys() & built.keys()):
        file, shape = stored[key]
        if shape != built[key]:
            raise ValueError(
                f"{path} does not match the weights of the {what}: it makes {key} {list(built[key])}, and {file} "
                f"holds {list(shape)}{_keys_behind(config, built[key], shape)}: {FIX}."
            )
    if 2 * len(stored.keys() & built.keys()) < len(stored):
        return  # the weights name their tensors otherwise (a published checkpoint that transformers renames)
    extra = sorted(stored.keys() - built.keys())
    stored_tensors = {id(tensors[key]) for key in stored.keys() & built.keys()}  # a tied weight is stored once
    missing = sorted(key for key in built.keys() - stored.keys() if id(tensors[key]) not in stored_tensors)
    for keys, kind in ((extra, "smaller"), (missing, "larger")):
        if keys:
            listed = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
            place = "have no place in it" if kind == "smaller" else "are not in the weights"
            raise ValueError(
                f"{path} describes a {kind} model than the weights of the {what}: {len(keys)} tensors ({listed}) "
                f"{place}: {FIX}."
            )


def _keys_behind(config: dict, built: tuple[int, ...], stored: tuple[int, ...]) -> str:
    """The config's sizes that equal a dimension the built model has and the weights do not: the likely culprit."""
    differing = {b for b, s in zip(built, stored, strict=False) if b != s} | set(built[len(stored) :])
    named = [f"{key}={value}" for key, value in _flat(config) if value in differing]
    return f" (from {', '.join(named)})" if named else ""


def _flat(config: dict, where: str = ""):
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{where}{key}.")
        elif isinstance(value, int) and not isinstance(value, bool):
            yield f"{where}{key}", value
