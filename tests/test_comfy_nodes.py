"""The ComfyUI node pack, loaded as ComfyUI loads a custom-node folder, over stand-ins of ComfyUI's modules,
executed on the reference model: node schemas, model folders, the loader's cache, the IMAGE contract,
progress with previews, Cancel, codes and the acceptance map."""

from __future__ import annotations

import inspect
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

REFERENCE = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"
NODE_IDS = ["SSDPipelineLoader", "SSDGenerate", "SSDDecodeCodes", "SSDAcceptanceMap"]
PROMPT = "a red circle left of a blue square"


def generate_inputs(pipeline, **overrides) -> dict:
    inputs = {
        "pipeline": pipeline, "prompt": PROMPT, "negative_prompt": "", "seed": 7, "batch_size": 1, "guidance": 3.0,
        "temperature": 1.0, "decoding": "ssd", "rounds": 1, "k_v": 1, "preview": False,
    }  # fmt: skip
    return inputs | overrides


@pytest.fixture(scope="session")
def nodes(comfy_pack) -> dict:
    return {name: cls() for name, cls in comfy_pack.NODE_CLASS_MAPPINGS.items()}


@pytest.fixture(scope="session")
def pipeline(nodes):
    (pipe,) = nodes["SSDPipelineLoader"].load(model="ssd-reference", dtype="float32", device="default")
    return pipe


def test_pack_exports_every_node_with_a_schema_comfyui_accepts(comfy_pack):
    assert list(comfy_pack.NODE_CLASS_MAPPINGS) == NODE_IDS
    assert set(comfy_pack.NODE_DISPLAY_NAME_MAPPINGS) == set(NODE_IDS)
    for name, cls in comfy_pack.NODE_CLASS_MAPPINGS.items():
        schema = cls.INPUT_TYPES()
        assert set(schema) <= {"required", "optional", "hidden"}, name
        inputs = {**schema["required"], **schema.get("optional", {})}
        for input_name, (kind, *options) in inputs.items():
            assert isinstance(kind, (str, list)), (name, input_name)
            assert options and options[0].get("tooltip"), f"{name}.{input_name} has no tooltip"
        # ComfyUI calls FUNCTION with the inputs as keyword arguments: the names must match.
        parameters = inspect.signature(getattr(cls, cls.FUNCTION)).parameters
        assert set(parameters) - {"self"} == set(inputs), name
        assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES) == len(cls.OUTPUT_TOOLTIPS), name
        assert cls.DESCRIPTION and cls.CATEGORY == "SSD"


def test_models_folder_is_registered_and_lists_pipelines_and_heads(comfy_pack, ssd_models):
    import folder_paths

    assert folder_paths.get_folder_paths("ssd") == [os.path.join(folder_paths.models_dir, "ssd")]
    (ssd_models / "mine").symlink_to(REFERENCE)  # a pipeline; its heads/ subfolder is part of it
    (ssd_models / "team" / "heads-v2").mkdir(parents=True)
    (ssd_models / "team" / "heads-v2" / "config.json").write_text(json.dumps({"_class_name": "DraftHeads"}))
    (ssd_models / "notes").mkdir()
    (ssd_models / "notes" / "config.json").write_text("{}")

    loader = comfy_pack.NODE_CLASS_MAPPINGS["SSDPipelineLoader"]
    choices = loader.INPUT_TYPES()["required"]["model"][0]
    assert choices == ["mine", "team/heads-v2", "ssd-reference"]


def test_links_that_point_back_up_or_out_are_not_searched(comfy_pack, ssd_models, tmp_path):
    """Issue 56: `a/up1 -> ..` and `a/up2 -> ..` made INPUT_TYPES() walk for ever (os.walk(followlinks=True))."""
    (ssd_models / "a").mkdir()
    (ssd_models / "a" / "up1").symlink_to("..")
    (ssd_models / "a" / "up2").symlink_to("..")
    outside = tmp_path / "elsewhere"  # a folder of models outside models/ssd: a link into it is not searched
    (outside / "hidden").mkdir(parents=True)
    (outside / "hidden" / "model_index.json").write_text("{}")
    (ssd_models / "out").symlink_to(outside)
    (ssd_models / "linked").symlink_to(REFERENCE)  # a link that is a model folder is listed
    deep = ssd_models / "d1" / "d2" / "d3" / "d4" / "d5"
    deep.mkdir(parents=True)
    (deep / "model_index.json").write_text("{}")
    (ssd_models / "d1" / "d2" / "shallow").mkdir()
    (ssd_models / "d1" / "d2" / "shallow" / "model_index.json").write_text("{}")

    loader = comfy_pack.NODE_CLASS_MAPPINGS["SSDPipelineLoader"]
    found = {}
    thread = threading.Thread(
        target=lambda: found.update(choices=loader.INPUT_TYPES()["required"]["model"][0]), daemon=True
    )
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "listing models/ssd did not end"
    assert found["choices"] == ["d1/d2/shallow", "linked", "ssd-reference"]


def test_loader_reuses_the_loaded_pipeline(comfy_pack, nodes, pipeline, monkeypatch, ssd_models):
    from ssd_pipelines import SSDAutoregressivePipeline

    loads = []
    original = SSDAutoregressivePipeline.from_pretrained
    monkeypatch.setattr(
        SSDAutoregressivePipeline,
        "from_pretrained",
        lambda *args, **kwargs: loads.append(args) or original(*args, **kwargs),
    )
    loader = nodes["SSDPipelineLoader"]
    assert loader.load(model="ssd-reference", dtype="float32", device="default")[0] is pipeline
    # ComfyUI's device is the CPU here, so naming it is the same pipeline.
    assert loader.load(model="ssd-reference", dtype="float32", device="cpu")[0] is pipeline
    assert loads == []

    (ssd_models / "copy").symlink_to(REFERENCE)
    other = loader.load(model="copy", dtype="float32", device="default")[0]
    assert other is not pipeline and len(loads) == 1
    by_path = loader.load(
        model="ssd-reference", dtype="float32", device="default", path_or_repo_id=str(ssd_models / "copy")
    )
    assert by_path[0] is other
    assert len(loads) == 1
    assert other.backbone.dtype == torch.float32 and other.device.type == "cpu"


def test_loader_names_a_missing_model(nodes, ssd_models):
    with pytest.raises(ValueError, match="no SSD model 'gone'.*path_or_repo_id"):
        nodes["SSDPipelineLoader"].load(model="gone", dtype="float32", device="default")


def test_loader_says_a_local_path_does_not_exist(nodes, ssd_models, tmp_path):
    with pytest.raises(ValueError) as raised:
        nodes["SSDPipelineLoader"].load(
            model="ssd-reference", dtype="float32", device="default", path_or_repo_id=str(tmp_path / "gone")
        )
    assert str(raised.value).startswith(f"no such folder: {tmp_path / 'gone'}.")
    assert "hf download" not in str(raised.value)


def test_loader_offline_hub_id_says_how_to_get_it(nodes, ssd_models, hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError) as raised:
        nodes["SSDPipelineLoader"].load(
            model="ssd-reference", dtype="float32", device="default", path_or_repo_id="org/ssd-model"
        )
    message = str(raised.value)
    assert message.startswith("'org/ssd-model' ")  # the library's own explanation comes first
    assert f"hf download org/ssd-model --local-dir {ssd_models / 'ssd-model'}" in message


def test_generate_returns_comfyui_images_codes_and_stats(nodes, pipeline):
    images, codes, stats = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, batch_size=2))
    # IMAGE: [B, H, W, C] float32 in 0..1 on the CPU, as SaveImage multiplies it by 255.
    assert images.shape == (2, 64, 64, 3) and images.dtype == torch.float32 and images.device.type == "cpu"
    assert images.is_contiguous() and 0.0 <= images.min() and images.max() <= 1.0
    assert not torch.equal(images[0], images[1])
    assert codes.codes.shape == codes.final_round.shape == (2, 16, 16) and codes.image_size == (64, 64)
    assert codes.codes.min() >= 0 and set(codes.final_round.unique().tolist()) <= {0, 1, 2}
    # docs/decoding.md: ssd with r = 1, k_v = 1 takes 36 passes on the 16 x 16 grid, whatever the batch.
    assert stats.splitlines()[:4] == ["decoding: ssd", "images: 2", "forward passes: 36", "rows completed: 16"]
    assert stats.splitlines()[5].startswith("acceptance per round: 0.")
    assert stats.splitlines()[6:] == ["guidance: 3"]


def test_guidance_is_checked_when_queued_and_0_is_the_models_own(comfy_pack):
    node = comfy_pack.NODE_CLASS_MAPPINGS["SSDGenerate"]
    guidance = node.INPUT_TYPES()["required"]["guidance"][1]
    assert guidance["default"] == guidance["min"] == 0.0 and "model's own" in guidance["tooltip"]
    for accepted in (0.0, 1.0, 3.0, 30.0):
        assert node.VALIDATE_INPUTS(guidance=accepted) is True
    for refused in (0.5, 0.99, 30.5, -1.0):
        assert node.VALIDATE_INPUTS(guidance=refused).startswith(f"{refused:g} is no guidance scale: 0 takes")


def test_guidance_0_runs_at_the_models_own_scale(nodes, pipeline, monkeypatch):
    # The adapter is built anew on each access: set the scale on its class, as 5 is Janus-Pro's.
    monkeypatch.setattr(type(pipeline.image_backbone), "default_guidance_scale", 5.0)
    images, _, stats = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, guidance=0.0))
    assert "guidance: 5" in stats.splitlines()
    expected = pipeline(
        PROMPT,
        generator=torch.Generator().manual_seed(7),
        guidance_scale=5.0,
        decoding="ssd",
        verify_rounds=1,
        output_type="np",
    )
    np.testing.assert_array_equal(images.numpy(), expected.images)
    other, _, _ = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, guidance=3.0))
    assert not np.array_equal(other.numpy(), expected.images)


def test_stats_and_log_carry_the_pipelines_warnings(nodes, pipeline, caplog):
    long_prompt = " ".join(["a red circle left of a blue square"] * 2)  # 16 words: the model reads 14
    with caplog.at_level("WARNING"):
        _, _, stats = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, prompt=long_prompt))
    (warning,) = [line for line in stats.splitlines() if line.startswith("warning: ")]
    assert "only the first" in warning and "Shorten the prompt" in warning
    assert [record.getMessage() for record in caplog.records] == [f"SSD Generate: {warning.removeprefix('warning: ')}"]


def test_generate_is_the_pipeline_call_with_the_same_seed(nodes, pipeline):
    images, codes, _ = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, decoding="ssd", rounds=2, k_v=2))
    expected = pipeline(
        PROMPT,
        generator=torch.Generator().manual_seed(7),
        decoding="ssd",
        verify_rounds=2,
        vertical_rows=2,
        output_type="np",
    )
    np.testing.assert_array_equal(images.numpy(), expected.images)
    assert torch.equal(codes.codes, expected.codes)
    (decoded,) = nodes["SSDDecodeCodes"].decode(pipeline=pipeline, codes=codes)
    torch.testing.assert_close(decoded, images)


def test_decoding_controls_come_from_the_library(comfy_pack):
    from ssd_pipelines.decoding import DEFAULT_DECODING, USER_DECODINGS, option_default, strategy_class

    required = comfy_pack.NODE_CLASS_MAPPINGS["SSDGenerate"].INPUT_TYPES()["required"]
    choices, decoding = required["decoding"]
    assert choices == list(USER_DECODINGS) and decoding["default"] == DEFAULT_DECODING == "auto"
    assert all(strategy_class(name).summary in decoding["tooltip"] for name in USER_DECODINGS)
    assert required["rounds"][1]["default"] == option_default("ssd", "verify_rounds") == 2
    assert required["k_v"][1]["default"] == option_default("ssd", "vertical_rows")


def test_each_decoding_gets_only_its_options(nodes, pipeline):
    # rounds and k_v are ssd's: the node must not pass them where the pipeline refuses them.
    _, codes, stats = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, decoding="ar", rounds=3, k_v=2))
    assert "forward passes: 256" in stats and codes.final_round.unique().tolist() == [0]
    _, _, stats = nodes["SSDGenerate"].generate(
        **generate_inputs(pipeline, decoding="exact", rounds=0, k_v=2, temperature=0.0)
    )
    assert "decoding: exact" in stats


def test_progress_advances_per_row_with_a_row_preview(nodes, pipeline, progress_calls):
    images, _, _ = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, preview=True))
    assert [(value, total) for value, total, _ in progress_calls] == [(row, 16) for row in range(1, 17)]
    for value, _total, (kind, preview, max_size) in progress_calls:
        assert kind == "PNG" and max_size is None and preview.size == (512, 512)
        pixels = np.asarray(preview)
        committed = value * 512 // 16  # each of the 16 rows is 32 preview pixels tall
        assert pixels[:committed].max() > 0
        assert value == 16 or pixels[committed:].max() == 0, "rows not committed yet are black"
    last = np.asarray(progress_calls[-1][2][1])[::8, ::8]  # one preview pixel per image pixel
    np.testing.assert_allclose(last / 255.0, images[0].numpy(), atol=1 / 255)


def test_progress_without_preview_sends_none(nodes, pipeline, progress_calls):
    nodes["SSDGenerate"].generate(**generate_inputs(pipeline, preview=False))
    assert len(progress_calls) == 16 and all(preview is None for _, _, preview in progress_calls)


def test_cancel_stops_decoding_between_rows(nodes, pipeline, progress_calls, comfy_interrupt):
    import comfy.utils

    def press_cancel_at_row_3(value, total, preview, node_id=None):
        progress_calls.append((value, total, preview))
        if value == 3:
            comfy_interrupt.interrupt_current_processing()  # what POST /interrupt does

    comfy.utils.set_progress_bar_global_hook(press_cancel_at_row_3)
    with pytest.raises(comfy_interrupt.InterruptProcessingException):
        nodes["SSDGenerate"].generate(**generate_inputs(pipeline, decoding="ar"))
    assert [value for value, _, _ in progress_calls] == [1, 2, 3]
    assert not comfy_interrupt.processing_interrupted()  # consumed, as ComfyUI's own check does
    # The shared pipeline is unharmed: the next run completes.
    comfy.utils.set_progress_bar_global_hook(None)
    images, _, stats = nodes["SSDGenerate"].generate(**generate_inputs(pipeline))
    assert images.shape == (1, 64, 64, 3) and "rows completed: 16" in stats


def test_acceptance_map_colours_cells_with_the_demos_palette(comfy_pack):
    from importlib import import_module

    from ssd_pipelines.acceptance import CATEGORIES, legend_lines

    codes_module = import_module(comfy_pack.__name__ + ".comfy_nodes.codes")
    final_round = torch.tensor([[[-1, 0, 1, 2], [3, 4, 5, 9]]])  # [B=1, R=2, C=4]
    expected = {  # with verify_rounds=2, a cell resampled in round 2 (final_round 3) was never checked again
        (0, 0): "not decoded", (0, 1): "from the model", (0, 2): "draft kept", (0, 3): "fixed, then kept",
        (1, 0): "resampled in the last round", (1, 1): "fixed, then kept", (1, 2): "fixed, then kept",
        (1, 3): "fixed, then kept",
    }  # fmt: skip
    colours = {category.label: torch.tensor(category.colour) / 255.0 for category in CATEGORIES}
    for last_round, changed in [(2, {}), (None, {(1, 0): "fixed, then kept"})]:
        codes = codes_module.SSDCodes(torch.zeros_like(final_round), final_round, (4, 8), last_round)
        (image,) = codes_module.SSDAcceptanceMap().draw(codes=codes)
        assert image.shape == (1, 4, 8, 3) and image.dtype == torch.float32
        for (row, col), label in (expected | changed).items():
            block = image[0, 2 * row : 2 * row + 2, 2 * col : 2 * col + 2]  # each cell is 2 x 2 pixels here
            assert torch.equal(block, colours[label].expand(2, 2, 3)), (last_round, row, col)
    assert all(line in codes_module.SSDAcceptanceMap.DESCRIPTION for line in legend_lines())


def test_acceptance_map_of_a_generation_matches_its_rounds(nodes, pipeline):
    from ssd_pipelines.acceptance import cell_colours

    images, codes, _ = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, rounds=2, batch_size=2))
    assert codes.last_round == 2
    (image,) = nodes["SSDAcceptanceMap"].draw(codes=codes)
    assert image.shape == images.shape
    colours = torch.from_numpy(cell_colours(codes.final_round, 2)).float() / 255.0  # [2, 16, 16, 3]
    for b, r, c in np.ndindex(2, 16, 16):
        cell = image[b, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4]  # 64 / 16 = 4 pixels a cell
        assert torch.equal(cell, colours[b, r, c].expand(4, 4, 3))
    _, ar_codes, _ = nodes["SSDGenerate"].generate(**generate_inputs(pipeline, decoding="ar", rounds=2))
    assert ar_codes.last_round is None  # rounds is ssd's
