"""The precisions the faces offer (`--dtype` of ssd-generate, ssd-serve, ssd-demo; `dtype` of the ComfyUI loader):
what each name loads, which this machine lists, and the error for a backend that is missing or a choice the device
cannot run."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest
import torch
from transformers import BitsAndBytesConfig, TorchAoConfig

from app import cli as demo_cli
from ssd_pipelines import cli
from ssd_pipelines.precisions import PRECISIONS, check_precision, runnable_precisions
from ssd_pipelines.quantization import precision_options
from ssd_pipelines.serving import cli as serve_cli
from ssd_pipelines.serving.loader import load_worker_pipeline

REAL_FIND_SPEC = importlib.util.find_spec


@pytest.fixture
def without(monkeypatch):
    """Hide installed packages from the check, as on a machine that lacks them."""

    def hide(*packages: str) -> None:
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name in packages else REAL_FIND_SPEC(name, *a)
        )

    return hide


def test_each_precision_names_its_dtype_and_quantization():
    assert precision_options("float32", "cpu") == {"dtype": torch.float32}
    assert precision_options("bfloat16", "cuda") == {"dtype": torch.bfloat16}
    assert precision_options("auto", "cpu") == {"dtype": "auto"}
    int8 = precision_options("int8", "cpu")
    assert int8["dtype"] == torch.float32 and isinstance(int8["quantization_config"], TorchAoConfig)
    on_gpu = precision_options("nf4", "cuda:1")  # bitsandbytes places while it quantizes: on that GPU at once
    config = on_gpu["quantization_config"]
    assert isinstance(config, BitsAndBytesConfig) and config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert on_gpu["dtype"] == config.bnb_4bit_compute_dtype == torch.bfloat16
    assert on_gpu["device_map"] == {"": "cuda:1"}
    assert "device_map" not in precision_options("nf4", "cpu")


def test_this_machine_lists_what_its_backends_run():
    assert runnable_precisions(["cpu"]) == list(PRECISIONS)  # torchao and bitsandbytes 0.50 are test requirements


def test_a_missing_backend_names_what_to_install(without):
    without("torchao")
    with pytest.raises(ValueError) as refused:
        check_precision("int8", "cpu")
    assert str(refused.value) == (
        "dtype int8 quantizes the backbone with torchao, which is not installed: pip install 'torchao>=0.18' "
        "(or 'ssd-pipelines[quantization]'), or choose float32, float16, bfloat16."
    )
    assert "int8" not in runnable_precisions(["cpu", "cuda"])


def test_nf4_on_the_cpu_needs_bitsandbytes_cpu_kernels(monkeypatch):
    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "0.45.5" if name == "bitsandbytes" else real_version(name)
    )
    with pytest.raises(ValueError, match=r"nf4 on the CPU needs bitsandbytes 0\.50 or newer .* has 0\.45\.5: .*"):
        check_precision("nf4", "cpu")
    check_precision("nf4", "cuda")  # CUDA kernels: any bitsandbytes
    assert runnable_precisions(["cpu"]) == ["auto", "float32", "float16", "bfloat16", "int8"]


def test_quantized_precisions_run_on_cpu_and_cuda_only():
    with pytest.raises(ValueError, match=r"^dtype int8 runs on cpu and cuda only, not mps: choose float32, "):
        check_precision("int8", "mps")
    check_precision("float16", "mps")


def test_ssd_generate_takes_a_precision(tmp_path, without, capsys):
    args = cli.parse_args(["a red circle", "--out", str(tmp_path / "x.png")])
    assert args.dtype == "float32"  # on the CPU; float16 on a GPU
    assert cli.parse_args(["a", "--out", str(tmp_path / "x.png"), "--dtype", "int8"]).dtype == "int8"
    without("bitsandbytes")
    with pytest.raises(SystemExit):
        cli.parse_args(["a", "--out", str(tmp_path / "x.png"), "--dtype", "nf4"])
    assert "ssd-generate: error: dtype nf4 quantizes the backbone with bitsandbytes, which is not installed: " in (
        capsys.readouterr().err
    )


def test_ssd_generate_draws_with_an_int8_backbone(tmp_path, capsys):
    out = tmp_path / "x.png"
    assert cli.main(["a red circle", "--out", str(out), "--dtype", "int8", "--decoding", "exact", "--json"]) == 0
    assert out.is_file() and '"forward_passes"' in capsys.readouterr().out


def test_ssd_serve_checks_the_precision_for_the_replicas_device(without, capsys):
    assert serve_cli.parse_args([]).dtype == "float32"
    assert serve_cli.parse_args(["--gpus-per-replica", "1"]).dtype == "float16"
    without("torchao")
    with pytest.raises(SystemExit):
        serve_cli.parse_args(["--dtype", "int8"])
    assert "dtype int8 quantizes the backbone with torchao, which is not installed" in capsys.readouterr().err


def test_a_worker_loads_its_backbone_in_int8():
    pipe = load_worker_pipeline(None, device="cpu", dtype="int8")
    weights = {type(m.weight).__name__ for m in pipe.backbone.modules() if isinstance(m, torch.nn.Linear)}
    assert "Int8Tensor" in weights and pipe.heads.dtype == torch.float32


def test_ssd_demo_takes_a_precision(without, capsys):
    assert demo_cli.parse_args(["--dtype", "int8"]).dtype == "int8"
    assert demo_cli.parse_args([]).dtype == "float32"
    without("bitsandbytes")
    with pytest.raises(SystemExit):
        demo_cli.parse_args(["--dtype", "nf4"])
    assert "bitsandbytes, which is not installed" in capsys.readouterr().err


def test_comfyui_loader_lists_what_runs_here_and_loads_int8(comfy_pack, without):
    loader = comfy_pack.NODE_CLASS_MAPPINGS["SSDPipelineLoader"]
    choices, options = loader.INPUT_TYPES()["required"]["dtype"]
    assert choices == list(PRECISIONS) and options["default"] == "float32"
    assert "int8: the backbone's linear weights in int8 (torchao, weight-only)" in options["tooltip"]
    without("bitsandbytes")
    assert "nf4" not in loader.INPUT_TYPES()["required"]["dtype"][0]  # no GPU here, and no bitsandbytes
    (pipe,) = loader().load(model="ssd-reference", dtype="int8", device="cpu")
    assert any(type(m.weight).__name__ == "Int8Tensor" for m in pipe.backbone.modules() if hasattr(m, "weight"))
