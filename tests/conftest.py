import pytest
import torch

from ssd_pipelines.testing import tiny_backbone, tiny_heads

pytest_plugins = [
    "hub_server",  # the `hub` fixture: a loopback Hugging Face Hub
    "demo_server",  # the Gradio demo served in a subprocess
    "comfy_stubs.fixtures",  # the ComfyUI node pack loaded over stand-ins of ComfyUI's modules
    "ray_cluster",  # the `ray_cluster` fixture: a local Ray the session starts and stops (serving tests)
]


@pytest.fixture(autouse=True)
def _few_threads():
    """The CI machine has two cores; tiny models run fastest on one thread each."""
    torch.set_num_threads(1)


@pytest.fixture
def backbone():
    return tiny_backbone(rows=4, cols=5, codebook_size=8)


@pytest.fixture
def heads(backbone):
    return tiny_heads(backbone)
