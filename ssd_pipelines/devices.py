"""The `--device` of the command lines, checked against this machine before a model loads.

Without the check, `--device cuda` on a machine without CUDA (or `--device bogus`) ends in a torch traceback after
the model has loaded. torch is imported only when a device is checked, after the arguments are parsed.
"""

from __future__ import annotations

DEFAULT_HELP = "cuda when there is one, else cpu"  # what check_device(None) picks


def devices_here() -> list[str]:
    """The devices a pipeline can move to on this machine: the CPU, then the accelerator's (e.g. cuda, cuda:0)."""
    import torch

    accelerator = torch.accelerator.current_accelerator()  # None on a machine with the CPU only
    if accelerator is None:
        return ["cpu"]
    return ["cpu", accelerator.type, *(f"{accelerator.type}:{i}" for i in range(torch.accelerator.device_count()))]


def device_type(name: str) -> str:
    """The type of a device name (cuda of cuda:1), without importing torch."""
    return name.split(":")[0]


def check_device(name: str | None) -> str:
    """`name` as given if this machine has that device; None: the default (cuda when there is one, else cpu).
    Otherwise a ValueError that says which devices there are and what to pass."""
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    here = devices_here()
    advice = f"this machine has {', '.join(here)}: pass one of those, or leave --device out ({DEFAULT_HELP})."
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name}: not a torch device; {advice}") from None
    if device.type != "cpu" and str(device) not in here:
        raise ValueError(f"--device {name}: there is no {device} device here; {advice}")
    return name
