"""`--device` is checked against this machine before a model loads (ssd-generate's cases are in test_cli.py)."""

import pytest
import torch

from app.cli import parse_args as demo_args
from ssd_pipelines.devices import check_device


def test_the_demo_refuses_a_device_this_machine_lacks_before_loading(capsys):
    with pytest.raises(SystemExit):
        demo_args(["--device", "cuda:99"])
    assert "ssd-demo: error: --device cuda:99: there is no cuda:99 device here; this machine has cpu" in (
        capsys.readouterr().err
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_devices_a_gpu_machine_has_are_taken_as_given():
    assert [check_device(name) for name in ("cuda", "cuda:0", "cpu")] == ["cuda", "cuda:0", "cpu"]
    assert check_device(None) == "cuda"
