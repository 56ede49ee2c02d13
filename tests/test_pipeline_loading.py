"""Loading what is broken or misnamed fails early, naming the file or folder and what to do."""

import json
import logging
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from diffusers import DDPMScheduler

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.loading import load_heads
from ssd_pipelines.testing import tiny_backbone, tiny_heads, tiny_pipeline


@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "pipe"
    tiny_pipeline().save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "remove, message",
    [
        ("backbone/config.json", r"backbone/config.json is missing \('backbone' needs it\)"),
        ("vqvae/diffusion_pytorch_model.safetensors", "'vqvae' has no safetensors weights in"),
        ("tokenizer/tokenizer_config.json tokenizer/tokenizer.json", r"tokenizer/tokenizer_config.json is missing"),
    ],
)
def test_a_missing_component_file_is_named_before_loading(saved, remove, message):
    """Without backbone/config.json, transformers would build a default 7B Llama and exhaust memory."""
    for name in remove.split():
        (saved / name).unlink()
    with pytest.raises(ValueError, match=f"could not load the pipeline .*{message}"):
        SSDAutoregressivePipeline.from_pretrained(saved)


@pytest.mark.parametrize("name", ["./no-such-model", "/definitely/not/here", "~/nope", "a/b/c"])
def test_a_path_that_does_not_exist_says_no_such_folder(name):
    with pytest.raises(ValueError, match=f"no such folder: {name}"):
        SSDAutoregressivePipeline.from_pretrained(name)


def test_a_path_to_a_file_asks_for_its_folder(saved):
    with pytest.raises(ValueError, match="model_index.json is a file: pass the folder that holds model_index.json"):
        SSDAutoregressivePipeline.from_pretrained(saved / "model_index.json")


def test_pickles_are_refused_by_name(saved):
    with pytest.raises(ValueError, match="load only safetensors weights"):
        SSDAutoregressivePipeline.from_pretrained(saved, use_safetensors=False)


def fewer_offsets_than_promised(folder):
    """Heads saved with one vertical offset whose config promises two."""
    backbone = tiny_backbone(rows=4, cols=4, codebook_size=8)
    tiny_heads(backbone, vertical=(1,)).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vertical_offsets": [1, 2]}))


def test_heads_whose_config_promises_more_offsets_than_the_weights_hold(tmp_path, saved):
    fewer_offsets_than_promised(tmp_path / "heads")
    with pytest.raises(ValueError, match=r"heads in .*heads are incomplete: .* \(vertical.1.down.weight"):
        load_heads(tmp_path / "heads")
    pipe = SSDAutoregressivePipeline.from_pretrained(saved)
    with pytest.raises(ValueError, match="are incomplete"):
        pipe.load_heads(tmp_path / "heads")
    fewer_offsets_than_promised(saved / "heads")  # the same, inside a pipeline folder: refused at load
    with pytest.raises(ValueError, match="drafting heads in .*pipe/heads are incomplete"):
        SSDAutoregressivePipeline.from_pretrained(saved)


def test_heads_whose_sizes_do_not_match_their_config(tmp_path):
    tiny_heads(tiny_backbone(rows=4, cols=4, codebook_size=8)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 16, "embed_size": 16}))
    with pytest.raises(ValueError, match="could not load drafting heads from .*match it") as caught:
        load_heads(tmp_path)
    assert "ignore_mismatched_sizes" not in str(caught.value)  # that advice would give random heads


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("decoding", ["ar", "ssd", "exact"])
def test_every_decoding_runs_however_the_pipeline_is_loaded(tmp_path, dtype, decoding):
    """Weights stored in fp16 (as the reference model ships) load in float32 unless asked, all components alike."""
    stored = tiny_pipeline()
    stored.to(torch.float16).save_pretrained(tmp_path)
    pipe = SSDAutoregressivePipeline.from_pretrained(tmp_path, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    expected = dtype or torch.float32
    assert {pipe.backbone.dtype, pipe.heads.dtype, pipe.vqvae.dtype} == {expected}
    out = pipe("a red circle", decoding=decoding, generator=torch.Generator().manual_seed(0), output_type="np")
    assert out.images.shape == (1, 16, 16, 3) and not out.interrupted


@pytest.mark.parametrize("decoding", ["ar", "ssd", "exact"])
def test_to_a_dtype_moves_every_component(decoding):
    pipe = tiny_pipeline().to(torch.bfloat16)
    assert {pipe.backbone.dtype, pipe.heads.dtype, pipe.vqvae.dtype} == {torch.bfloat16}
    out = pipe("a red circle", decoding=decoding, generator=torch.Generator().manual_seed(0), output_type="np")
    assert out.images.shape == (1, 16, 16, 3)


def test_heads_in_another_dtype_than_the_backbone_still_draft():
    pipe = tiny_pipeline()
    pipe.backbone.to(torch.bfloat16)
    out = pipe("a red circle", decoding="ssd", generator=torch.Generator().manual_seed(0), output_type="latent")
    assert (out.codes >= 0).all()


def test_a_pipeline_whose_heads_do_not_match_their_config(saved):
    config = json.loads((saved / "heads" / "config.json").read_text())
    (saved / "heads" / "config.json").write_text(json.dumps({**config, "intermediate_size": 8}))
    with pytest.raises(ValueError, match="could not load the pipeline .*expected shape .*match their config") as caught:
        SSDAutoregressivePipeline.from_pretrained(saved)
    assert "ignore_mismatched_sizes" not in str(caught.value)


@pytest.mark.parametrize(
    "text, fault",
    [
        (
            '{"_class_name": "SSDAutoregressivePipeline",',
            "is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 45 (char 44))",
        ),
        ('["backbone"]', "holds a list, not a JSON object"),
    ],
)
def test_a_damaged_model_index_names_the_file(saved, text, fault):
    (saved / "model_index.json").write_text(text)
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained(saved)
    assert str(caught.value) == (
        f"{saved / 'model_index.json'} {fault}: correct it, re-download it (force_download=True), or re-save the "
        "model with save_pretrained."
    )


def test_a_component_beside_ours_needs_its_own_config_file(saved):
    """A scheduler saves scheduler_config.json: asking it for a tokenizer's config would refuse a sound pipeline."""
    index = json.loads((saved / "model_index.json").read_text())
    (saved / "model_index.json").write_text(json.dumps({**index, "scheduler": ["diffusers", "DDPMScheduler"]}))
    (saved / "scheduler").mkdir()
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained(saved)
    assert str(caught.value) == (
        f"could not load the pipeline {saved}: {saved / 'scheduler' / 'scheduler_config.json'} is missing "
        "('scheduler' needs it). Re-download the pipeline, or re-save it with save_pretrained."
    )
    DDPMScheduler().save_pretrained(saved / "scheduler")
    assert SSDAutoregressivePipeline.from_pretrained(saved).heads is not None


def test_a_subclass_loads_as_itself_from_a_pipeline_and_from_heads(saved, tmp_path):
    class Custom(SSDAutoregressivePipeline):
        pass

    assert type(Custom.from_pretrained(saved)) is Custom
    heads = tiny_heads(tiny_backbone(rows=4, cols=4, codebook_size=8))
    heads.register_to_config(base_model=str(saved))
    heads.save_pretrained(tmp_path / "heads")
    pipe = Custom.from_pretrained(tmp_path / "heads")
    assert type(pipe) is Custom and pipe.config._name_or_path == str(saved)


def test_loading_heads_into_a_bf16_pipeline_casts_them_without_a_warning(saved, caplog):
    """diffusers' `ModelMixin.to` warned on each cast that modules "should be kept in float32: []", naming none."""
    pipe = SSDAutoregressivePipeline.from_pretrained(saved, dtype=torch.bfloat16)
    caplog.clear()
    pipe.load_heads(saved / "heads")  # stored in float32
    assert next(pipe.heads.parameters()).dtype == torch.bfloat16
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


REFERENCE = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"


@pytest.mark.parametrize("base_model", ["deepseek-community/Janus-Pro-7B", "/elsewhere/another-model"])
def test_heads_naming_another_backbone_whose_shapes_fit_warn(tmp_path, base_model):
    """Issue 40: they loaded without a word, and then the backbone rejects their drafts."""
    heads = shutil.copytree(REFERENCE / "heads", tmp_path / "heads")
    config = json.loads((heads / "config.json").read_text())
    (heads / "config.json").write_text(json.dumps({**config, "base_model": base_model}))
    pipe = SSDAutoregressivePipeline.from_pretrained(REFERENCE)
    with pytest.warns(UserWarning) as warned:
        pipe.load_heads(heads)
    assert [str(w.message) for w in warned] == [
        (
            f"these heads were trained for {base_model!r} and this pipeline was loaded from {str(REFERENCE)!r}: their "
            f"shapes fit, but unless {str(REFERENCE)!r} is a copy of {base_model!r} the backbone will reject most of "
            "their drafts ('exact' and 'auto' stay lossless but slow, 'ssd' draws worse images). Load the heads trained "
            "for this backbone."
        )
    ]


def test_heads_of_a_local_copy_of_their_base_model_load_without_a_word(tmp_path):
    """The published reference heads name ssd-pipelines/ssd-reference; this folder is a copy of it by that name."""
    pipe = SSDAutoregressivePipeline.from_pretrained(REFERENCE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe.load_heads(REFERENCE / "heads")


def edit_config(path: Path, **changes) -> None:
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


FIX = "correct it, re-download it (force_download=True), or re-save the model with save_pretrained."


@pytest.mark.parametrize(
    "component, changes, fault",
    [
        ("backbone", {"hidden_size": "256"}, ": hidden_size must be a positive integer, got '256'"),
        ("backbone", {"num_hidden_layers": -1}, ": num_hidden_layers must be a positive integer, got -1"),
        ("vqvae", {"num_vq_embeddings": "many"}, ": num_vq_embeddings must be a positive integer, got 'many'"),
        (
            "backbone",
            {"rms_norm_eps": "small"},
            (
                " does not describe a LlamaForCausalLM (TypeError: Field 'rms_norm_eps' expected float, got str "
                "(value: 'small'))"
            ),
        ),
        (
            "backbone",
            {"vocab_size": 10**12},
            (
                " does not match the weights of the backbone: it makes lm_head.weight [1000000000000, 32], and "
                "model.safetensors holds [24, 32] (from vocab_size=1000000000000)"
            ),
        ),
    ],
)
def test_a_config_value_of_the_wrong_type_or_range_names_file_and_key(saved, component, changes, fault):
    """Issue 56: these ended in tracebacks from inside the libraries, or in "look at the above report"."""
    edit_config(saved / component / "config.json", **changes)
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained(saved)
    assert str(caught.value) == f"{saved / component / 'config.json'}{fault}: {FIX}"


@pytest.mark.parametrize("layers, kind, first", [(1, "smaller", "model.layers.1."), (3, "larger", "model.layers.2.")])
def test_a_config_of_another_depth_than_the_weights_is_refused(saved, layers, kind, first):
    """A layer too many was filled with random weights, one too few dropped without a word."""
    edit_config(saved / "backbone" / "config.json", num_hidden_layers=layers)
    with pytest.raises(
        ValueError,
        match=f"describes a {kind} model than the weights of the backbone: 9 tensors \\({first}input_layernorm.weight",
    ):
        SSDAutoregressivePipeline.from_pretrained(saved)


def test_a_config_that_is_a_list_names_the_file(saved):
    (saved / "backbone" / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained(saved)
    assert str(caught.value) == f"{saved / 'backbone' / 'config.json'} holds a list, not a JSON object: {FIX}"


def test_a_backbone_without_an_image_grid_is_refused_at_load(saved):
    """It loaded, and every call failed with "'SSDAutoregressivePipeline' object has no attribute 'image_backbone'"."""
    config = json.loads((saved / "backbone" / "config.json").read_text())
    grid = config.pop("image_grid")
    (saved / "backbone" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"could not load {saved}: this Llama model has no `image_grid` in its config"):
        SSDAutoregressivePipeline.from_pretrained(saved)
    edit_config(saved / "backbone" / "config.json", image_grid={**grid, "rows": "4"})
    with pytest.raises(
        ValueError, match=r"`image_grid.rows` in the backbone's config.json must be an integer >= 1, got '4'"
    ):
        SSDAutoregressivePipeline.from_pretrained(saved)


@pytest.mark.parametrize("file", ["tokenizer.json", "tokenizer_config.json"])
@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_damaged_tokenizer_file_is_named_with_its_fault(saved, file, damage):
    """It read "Expecting value: line 1 column 1 (char 0). Its weights must be readable safetensors files"."""
    path = saved / "tokenizer" / file
    path.write_text("" if damage == "empty" else path.read_text()[:40])
    with pytest.raises(ValueError) as caught:
        SSDAutoregressivePipeline.from_pretrained(saved)
    message = str(caught.value)
    assert message.startswith(f"{path} is not valid JSON (") and message.endswith(f"): {FIX}")
    assert "safetensors" not in message
