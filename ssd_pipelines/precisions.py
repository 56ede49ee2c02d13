"""The precisions a face offers for a pipeline's weights: `--dtype` of the command lines, `dtype` of the ComfyUI loader.

A float dtype applies to every component. `int8` and `nf4` quantize the backbone only (torchao's int8 weight-only,
bitsandbytes' 4-bit NormalFloat) and compute in float32 on the CPU, bfloat16 on a GPU; the heads and the VQ decoder
keep that compute dtype. Declared free of torch so that the command lines parse at once: whether a backend is
installed is read from the package index of this environment, not by importing it. `quantization.precision_options`
turns a name into `from_pretrained`'s arguments.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    about: str
    backend: str | None = None  # the package that quantizes the backbone
    requirement: str | None = None  # what pip installs for it
    devices: tuple[str, ...] = ()  # device types it runs on; () is every device


FLOATS = ("float32", "float16", "bfloat16")
NF4_CPU_BITSANDBYTES = (0, 50)  # bitsandbytes' own CPU kernels for 4-bit weights; 0.50.2 tested here
PRECISIONS = {
    "auto": Precision("auto", "every component in the dtype its weights are stored in (the backbone's config.json)"),
    "float32": Precision("float32", "every component in float32: fastest on a CPU, 4 bytes a weight"),
    "float16": Precision("float16", "every component in float16: 2 bytes a weight, for GPUs"),
    "bfloat16": Precision("bfloat16", "every component in bfloat16: 2 bytes a weight, for GPUs"),
    "int8": Precision(
        "int8",
        "the backbone's linear weights in int8 (torchao, weight-only): about 1 byte a weight",
        backend="torchao",
        requirement="torchao>=0.18",
        devices=("cpu", "cuda"),
    ),
    "nf4": Precision(
        "nf4",
        "the backbone's linear weights in 4-bit NormalFloat (bitsandbytes): about 0.5 byte a weight",
        backend="bitsandbytes",
        requirement="bitsandbytes>=0.50",
        devices=("cpu", "cuda"),
    ),
}
DEFAULT_HELP = "float32 on the CPU, float16 on a GPU"


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """The `--dtype` of every command line that loads a pipeline."""
    parser.add_argument(
        "--dtype",
        choices=list(PRECISIONS),
        default=None,
        help="precision of the weights: float32, float16, bfloat16, auto (as stored), or the backbone quantized: "
        f"int8 (torchao), nf4 (bitsandbytes); default: {DEFAULT_HELP}",
    )


def compute_dtype(name: str, device_type: str) -> str:
    """The dtype a pipeline computes in: the float named, or for a quantized backbone float32 on the CPU (where
    half precision is slow) and bfloat16 elsewhere; `auto` is resolved by the loader from the weights."""
    if name in FLOATS or name == "auto":
        return name
    return "float32" if device_type == "cpu" else "bfloat16"


def default_precision(device_type: str) -> str:
    return "float32" if device_type == "cpu" else "float16"


def check_precision(name: str, device_type: str) -> None:
    """A ValueError that names what to install or choose when `name` cannot run on `device_type` here."""
    if name not in PRECISIONS:
        raise ValueError(f"dtype {name}: not a precision; choose one of {', '.join(PRECISIONS)}.")
    precision = PRECISIONS[name]
    if precision.devices and device_type not in precision.devices:
        raise ValueError(
            f"dtype {name} runs on {' and '.join(precision.devices)} only, not {device_type}: choose "
            f"{', '.join(FLOATS)} there."
        )
    if precision.backend is None:
        return
    if importlib.util.find_spec(precision.backend) is None:
        raise ValueError(
            f"dtype {name} quantizes the backbone with {precision.backend}, which is not installed: "
            f"pip install '{precision.requirement}' (or 'ssd-pipelines[quantization]'), or choose {', '.join(FLOATS)}."
        )
    if name == "nf4" and device_type == "cpu" and _version(precision.backend) < NF4_CPU_BITSANDBYTES:
        raise ValueError(
            f"dtype nf4 on the CPU needs bitsandbytes {'.'.join(map(str, NF4_CPU_BITSANDBYTES))} or newer (its CPU "
            f"kernels for 4-bit weights), and this environment has {importlib.metadata.version('bitsandbytes')}: "
            f"pip install -U '{precision.requirement}', choose int8 on the CPU, or run nf4 on a CUDA GPU."
        )


def runnable_precisions(device_types: list[str]) -> list[str]:
    """The precisions that run here on at least one of `device_types`, in the order of `PRECISIONS`."""
    return [name for name in PRECISIONS if any(_runs(name, device) for device in device_types)]


def _runs(name: str, device_type: str) -> bool:
    try:
        check_precision(name, device_type)
    except ValueError:
        return False
    return True


def _version(package: str) -> tuple[int, ...]:
    numbers = []
    for part in importlib.metadata.version(package).split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        numbers.append(int(digits or 0))
    return tuple(numbers)
