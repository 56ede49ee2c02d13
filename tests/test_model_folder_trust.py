"""A model folder is data: what its files name is never imported, run, or opened outside it (issue 56).

`model_index.json` names each component's library. Importing a module runs it, so a folder naming
`evil.backbone.pwn`, with `evil/backbone/pwn.py` beside it and its parent on `sys.path` (a script run next to the
folder, ComfyUI's root above `models/ssd/`), ran that file when it loaded.
"""

import json
import sys

import pytest

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.testing import tiny_pipeline


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A saved pipeline inside a folder on sys.path, beside a module that records that it ran."""
    root = tmp_path / "models"
    folder = root / "evil"
    tiny_pipeline().save_pretrained(folder)
    (folder / "__init__.py").write_text("")
    (folder / "backbone" / "__init__.py").write_text("")
    marker = tmp_path / "ran.txt"
    (folder / "backbone" / "pwn.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import LlamaForCausalLM\n"
    )
    monkeypatch.syspath_prepend(str(root))
    return folder, marker


def index_with(folder, **components):
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, **components}))


def test_a_library_the_folder_names_is_never_imported(planted):
    folder, marker = planted
    index_with(folder, backbone=["evil.backbone.pwn", "LlamaForCausalLM"])
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained(folder)
    assert str(caught.value) == (
        f"could not load the pipeline {folder}: its model_index.json names the module 'evil.backbone.pwn' for "
        "'backbone', and components load only from ssd_pipelines, transformers, diffusers. A model folder's files "
        "are never run as code: re-save the pipeline with save_pretrained, or pass the component itself "
        "(from_pretrained(..., backbone=...))."
    )
    assert not marker.exists() and "evil" not in sys.modules


def test_the_same_folder_loads_when_it_names_transformers(planted):
    """The planted module is importable: only the library check kept it from running."""
    folder, marker = planted
    assert SSDAutoregressivePipeline.from_pretrained(folder).backbone is not None
    assert not marker.exists()


@pytest.mark.parametrize("device_map", [None, "cpu"])  # a device map loads the backbone through transformers first
def test_the_library_is_checked_on_every_loading_path(planted, device_map):
    folder, marker = planted
    index_with(folder, vqvae=["evil.backbone.pwn", "VQModel"])
    options = {} if device_map is None else {"device_map": device_map}
    with pytest.raises(ValueError, match="names the module 'evil.backbone.pwn' for 'vqvae'"):
        SSDAutoregressivePipeline.from_pretrained(folder, **options)
    assert not marker.exists()


def test_a_name_that_is_not_a_class_is_refused(planted):
    folder, _ = planted
    index_with(folder, backbone=["transformers", "pipeline"])  # a function of transformers, not a model class
    with pytest.raises(ValueError, match="names transformers.pipeline for 'backbone', which this version of "):
        SSDAutoregressivePipeline.from_pretrained(folder)


def test_a_custom_pipeline_class_in_the_folder_is_refused_by_name(planted):
    folder, marker = planted
    (folder / "pipeline.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    index_with(folder, _class_name=["pipeline", "MyPipeline"])
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained(folder)
    assert str(caught.value) == (
        f"could not load the pipeline {folder}: its model_index.json asks for the custom pipeline code pipeline.py "
        "in the folder (['pipeline', 'MyPipeline'] as _class_name), and a model folder's files are never run as "
        'code. Set "_class_name" to "SSDAutoregressivePipeline", or re-save the pipeline with save_pretrained.'
    )
    assert not marker.exists()


@pytest.mark.parametrize("shard", ["../../elsewhere.safetensors", "/etc/elsewhere.safetensors", ".hidden"])
def test_a_weights_index_may_name_only_files_beside_it(planted, shard):
    """transformers opens the files a sharded checkpoint's index names, joined to the folder."""
    folder, _ = planted
    index = folder / "backbone" / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": shard}}))
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained(folder)
    assert str(caught.value).startswith(
        f"{index} names {shard!r} as a weights file: an index may name only files beside it, in {index.parent}"
    )
