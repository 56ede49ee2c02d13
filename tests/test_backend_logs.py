"""Importing the package is quiet with the quantization backends installed (issue 56, case 16), and only the
harmless records of their loggers are dropped (ssd_pipelines/backend_logs.py)."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from enum import Enum

import pytest

import ssd_pipelines  # noqa: F401 (installs the filters)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_importing_the_pipeline_and_backbones_prints_nothing():
    """transformers and diffusers import torchao with their model classes: five lines of its kernels, torch's
    enum deprecation and diffusers' unpickling note were printed before any float32 run, and bitsandbytes' refused
    Hub kernel once the `kernels` package began to refuse unverified repositories."""
    code = (
        "from ssd_pipelines import SSDAutoregressivePipeline\n"
        "from transformers import LlamaForCausalLM\n"
        "import sys; assert 'torchao' in sys.modules, 'torchao was not imported: this test would pass unseen'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""


class KernelPreference(Enum):
    AUTO = "auto"


def test_only_the_harmless_records_are_dropped(caplog):
    caplog.set_level(logging.DEBUG)
    torchao, pytree = logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")
    quantizer = logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer")
    cpu_ops = logging.getLogger("bitsandbytes.backends.cpu.ops")
    hub_kernel = (
        "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already `pip install "
        "kernels` and the kernels >= 0.11.1"
    )
    enum_note = "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type."

    torchao.warning("Failed to load /site-packages/torchao/_C_mxfp8.so: Could not load this library")
    KernelPreference.__module__ = "torchao.quantization.quantize_.common"
    pytree.warning(enum_note, KernelPreference)
    quantizer.warning("Unable to import `torchao` Tensor objects. This may affect loading checkpoints")
    cpu_ops.warning(hub_kernel, "Kernel repository could not verify publisher trust status")
    assert caplog.messages == []

    torchao.warning("Failed to load /models/weights.bin")
    KernelPreference.__module__ = "my_library"
    pytree.warning(enum_note, KernelPreference)
    quantizer.warning("Unable to quantize the weights")
    cpu_ops.warning("nf4 weights on this CPU need AVX512")
    assert caplog.messages == [
        "Failed to load /models/weights.bin",
        enum_note % KernelPreference,
        "Unable to quantize the weights",
        "nf4 weights on this CPU need AVX512",
    ]
