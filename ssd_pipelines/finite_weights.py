"""Refuse loaded weights that are not finite.

A safetensors file whose data bytes are damaged but whose header is intact loads without an error, and its NaN or
infinite weights then draw garbage images. The check costs one read of each floating tensor on its own device
(`aminmax`: NaN and infinities reach the extremes, and it needs no temporary the tensor's size, unlike
`isfinite(t).all()`) and one host read per device at the end; only when a tensor fails are the files looked into,
to name the file and the tensor as stored there.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

NOT_FINITE = "holds NaN or infinite values"


def check_finite(module: torch.nn.Module, where: Path | str, component: str) -> None:
    """Raise a ValueError naming the safetensors file and the tensor, as stored, whose values loaded into `module`
    are NaN or infinite. `where` is the folder (or the one file) the weights were loaded from; `component` says what
    was loaded, e.g. "backbone of org/name"."""
    tensors = [
        (name, t)
        for name, t in itertools.chain(module.named_parameters(), module.named_buffers())
        if t.is_floating_point() and not t.is_meta and t.numel() and type(t.data) is torch.Tensor
    ]  # a quantized weight is a tensor subclass (torchao's) whose own integer data and scales its backend checks
    bad = [tensors[i] for i in _not_finite([t for _, t in tensors])]
    if bad:
        raise ValueError(_message(module, bad, Path(where), component))


def _not_finite(tensors: list[torch.Tensor]) -> list[int]:
    """The indices of the tensors holding a NaN or an infinity: one reduction a tensor, queued on every device
    before the host reads each device's flags once."""
    by_device = defaultdict(list)
    for i, t in enumerate(tensors):
        by_device[t.device].append(i)
    flags = {}
    for device, indices in by_device.items():
        lows, highs = zip(*(torch.aminmax(tensors[i]) for i in indices))
        flags[device] = torch.stack(lows + highs).isfinite().view(2, -1).all(0)
    return sorted(i for device, ok in flags.items() for i, fine in zip(by_device[device], ok.tolist()) if not fine)


def _message(module: torch.nn.Module, bad: list[tuple[str, torch.Tensor]], where: Path, component: str) -> str:
    name, tensor = bad[0]
    others = [n for n, _ in bad[1:]]
    listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    also = f" (and {len(others)} more tensors: {listed})" if others else ""
    aliases = [n for n, t in _all_named(module) if t is tensor]  # tied weights are stored under one of their names
    found = _locate(tensor, aliases, _files(where))
    if found is None:
        return (
            f"could not load the {component}: its tensor '{name}' {NOT_FINITE}{also}, and no safetensors file in "
            f"{where} holds such values (it may be computed on loading). Re-download the weights "
            "(force_download=True) or re-save the model with save_pretrained."
        )
    file, key, overflow = found
    loaded_as = "" if key == name else f" (loaded as '{name}')"
    if overflow:
        return (
            f"could not load the {component}: tensor '{key}' of {file}{loaded_as} is finite there but overflows "
            f"{tensor.dtype}{also}: load the model in a wider dtype (dtype=torch.bfloat16 or torch.float32)."
        )
    return (
        f"could not load the {component}: tensor '{key}' of {file}{loaded_as} {NOT_FINITE}{also}. The file's data "
        "is damaged though its header reads: re-download it (force_download=True) or re-save the model with "
        "save_pretrained."
    )


def _all_named(module: torch.nn.Module):
    return itertools.chain(
        module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)
    )


def _files(where: Path) -> list[Path]:
    """The safetensors files weights were loaded from: `where` itself, the shards its index files list, or every
    safetensors file in the folder."""
    if where.is_file():
        return [where]
    shards = {where / f for index in where.glob("*.safetensors.index.json") for f in _weight_map(index).values()}
    return sorted(shards) or sorted(where.glob("*.safetensors"))


def _weight_map(index: Path) -> dict[str, str]:
    return json.loads(index.read_text()).get("weight_map", {})


def _locate(tensor: torch.Tensor, aliases: list[str], files: list[Path]) -> tuple[Path, str, bool] | None:
    """The file and stored name `tensor` came from, and whether its stored values merely overflow its loaded dtype.

    Loaders may rename keys (transformers re-prefixes some: Emu3's "text_model.model.x" loads as
    "model.text_model.x"), so every stored floating tensor of its shape is a candidate, likeliest by name first (headers only);
    the first whose stored values are not finite is it. Failing that, the likeliest one if its values exceed the
    loaded dtype's range; else None.
    """
    shape = list(tensor.shape)
    candidates = []
    for file in files:
        with safe_open(file, "pt") as f:
            slices = {key: f.get_slice(key) for key in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
            candidates += [(file, k) for k, s in slices.items() if s.get_shape() == shape and _floating(s.get_dtype())]
    candidates.sort(key=lambda c: max(_likeness(c[1], alias) for alias in aliases), reverse=True)
    for file, key in candidates:
        if not _stored(file, key).isfinite().all():
            return file, key, False
    if candidates and _stored(*candidates[0]).abs().max() > torch.finfo(tensor.dtype).max:
        return (*candidates[0], True)
    return None


def _floating(dtype: str) -> bool:
    """Whether a safetensors dtype ("F16", "BF16", "F8_E4M3", "I64", "BOOL") is a floating one."""
    return dtype.startswith(("F", "BF"))


def _stored(file: Path, key: str) -> torch.Tensor:
    with safe_open(file, "pt") as f:
        return f.get_tensor(key)


def _likeness(stored: str, loaded: str) -> tuple[int, int, int]:
    """How alike two dotted names are: the parts their tails share, then the parts they share anywhere (for moved
    prefixes), then how close their lengths are (an exact match first)."""
    a, b = stored.split("."), loaded.split(".")
    tail = next((n for n in range(min(len(a), len(b))) if a[-1 - n] != b[-1 - n]), min(len(a), len(b)))
    return tail, len(set(a) & set(b)), -abs(len(a) - len(b))
