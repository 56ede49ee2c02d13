"""A training run's state, weights and AdamW moments, saved as safetensors so another run resumes it.

Continuing from saved weights alone (a fresh optimizer, a new warm-up) costs a run
its first few hundred steps, which first raise the loss. Resuming with the Adam
moments and the step count continues the run as if it had not stopped. The
moments go into a safetensors file, not a pickle (`torch.save`), so a state can be
handed around and loaded as safely as weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

MOMENTS = ("exp_avg", "exp_avg_sq", "step")


def save_training_state(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, folder: Path) -> None:
    """Write `folder/backbone` (save_pretrained) and `folder/optimizer.safetensors` (moments, step count)."""
    model.save_pretrained(folder / "backbone")
    names = {param: name for name, param in model.named_parameters()}
    tensors = {
        f"{names[param]}.{key}": state[key].detach().to("cpu").reshape(-1).contiguous()
        for param, state in optimizer.state.items()
        for key in MOMENTS
    }
    save_file(tensors, str(folder / "optimizer.safetensors"), metadata={"step": str(step)})


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> int:
    """Put the saved moments into `optimizer` (built over `model.parameters()`); returns the saved step count."""
    path = folder / "optimizer.safetensors"
    try:
        with safe_open(str(path), framework="pt") as f:
            step = int((f.metadata() or {})["step"])
            saved = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (SafetensorError, OSError, KeyError, ValueError) as error:
        raise ValueError(f"{path} is not a readable optimizer state ({error}): resume from another state") from error
    for name, param in model.named_parameters():
        missing = [key for key in MOMENTS if f"{name}.{key}" not in saved]
        if missing:
            raise ValueError(f"{path} has no {missing[0]} for {name}: it is the state of another model, or of no step")
        optimizer.state[param] = {
            "step": saved[f"{name}.step"].reshape(()),
            "exp_avg": saved[f"{name}.exp_avg"].to(param.device).view_as(param),
            "exp_avg_sq": saved[f"{name}.exp_avg_sq"].to(param.device).view_as(param),
        }
    return step
