"""Quiets what the quantization backends log when they are merely imported, which is harmless to this package.

transformers and diffusers import torchao (and diffusers bitsandbytes) as soon as their model classes are imported,
whenever it is installed (`pip install -e ".[quantization]"`), so a float32 run printed five lines before its first
image: torchao's kernels built for other GPUs or another Python ("Failed to load .../torchao/_C_mxfp8...so"),
torch's deprecation of two torchao enums registered with pytree, and diffusers' "Unable to import `torchao` Tensor
objects", which matters only for unpickling torchao checkpoints, and this package loads safetensors only. On a CPU
with AVX512-BF16, bitsandbytes also asks the `kernels` package for a compiled kernel from the Hub
("kernels-community/quantization-bitsandbytes"), which `kernels` refuses as unverified (and offline there is none):
bitsandbytes then runs its own CPU kernels, and this package would not run code fetched from the Hub anyway.
A filter on each of those loggers drops exactly those records; everything else they log still shows.
"""

from __future__ import annotations

import logging


def _failed_torchao_kernel(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return message.startswith("Failed to load ") and "/torchao/_C" in message


def _torchao_enum_registered(record: logging.LogRecord) -> bool:
    registered = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return "is an Enum subclass" in str(record.msg) and getattr(registered, "__module__", "").startswith("torchao")


def _hub_kernel_refused(record: logging.LogRecord) -> bool:
    return record.getMessage().startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


def _torchao_pickles(record: logging.LogRecord) -> bool:
    return record.getMessage().startswith("Unable to import `torchao` Tensor objects")


HARMLESS = {  # logger: the records of it that say nothing a user of this package can act on
    "torchao": _failed_torchao_kernel,
    "torch.utils._pytree": _torchao_enum_registered,
    "diffusers.quantizers.torchao.torchao_quantizer": _torchao_pickles,
    "bitsandbytes.backends.cpu.ops": _hub_kernel_refused,
}


class _DropHarmless(logging.Filter):
    def __init__(self, harmless):
        super().__init__()
        self.harmless = harmless

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.harmless(record)


def quiet_backend_imports() -> None:
    """Installs the filters once: before transformers or diffusers is imported, so that their imports are quiet."""
    for name, harmless in HARMLESS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropHarmless) for f in logger.filters):
            logger.addFilter(_DropHarmless(harmless))
