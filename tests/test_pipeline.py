"""SSDAutoregressivePipeline: the diffusers contract, local save/load, inputs and errors."""

import json
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.testing import tiny_backbone, tiny_heads, tiny_pipeline


@pytest.fixture
def pipe():
    return tiny_pipeline()


def run(pipe, **kwargs):
    kwargs.setdefault("generator", torch.Generator().manual_seed(0))
    return pipe("a red circle", **kwargs)


def test_save_and_load_round_trip_gives_identical_codes(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["heads"] == ["ssd_pipelines", "DraftHeads"] and index["vqvae"] == ["diffusers", "VQModel"]
    assert not list(tmp_path.rglob("*.bin"))  # safetensors only
    loaded = SSDAutoregressivePipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    for decoding in ("ssd", "exact", "ar"):
        assert torch.equal(run(pipe, decoding=decoding).codes, run(loaded, decoding=decoding).codes)


@pytest.mark.parametrize(
    "output_type, kind, shape",
    [
        ("pil", list, None),
        ("np", np.ndarray, (2, 16, 16, 3)),
        ("pt", torch.Tensor, (2, 3, 16, 16)),
        ("latent", torch.Tensor, (2, 4, 4)),
    ],
)
def test_output_types(pipe, output_type, kind, shape):
    out = run(pipe, num_images_per_prompt=2, output_type=output_type)
    assert isinstance(out.images, kind)
    if shape:
        assert tuple(out.images.shape) == shape
    else:
        assert len(out.images) == 2 and isinstance(out.images[0], PIL.Image.Image) and out.images[0].size == (16, 16)
    assert out.codes.shape == (2, 4, 4)


def test_every_decoding_mode_and_its_statistics(pipe):
    ar = run(pipe, decoding="ar", guidance_scale=1.0)
    assert ar.stats["strategy"] == "ar" and ar.stats["forward_passes"] == 16
    ssd = run(pipe, decoding="ssd", verify_rounds=1, vertical_rows=2)
    assert ssd.stats["forward_passes"] == (1 + 2) * 2  # one first-row block and two 2-row blocks, r + 1 each
    assert len(ssd.stats["acceptance_per_round"]) == 1
    greedy = {d: run(pipe, decoding=d, temperature=0).codes for d in ("ar", "exact")}
    assert torch.equal(greedy["ar"], greedy["exact"])
    pipelined = run(pipe, decoding="ssd", verify_rounds=0, window=5)  # 4 rows of 4 codes + end-of-line: S = 20
    assert pipelined.stats["forward_passes"] == 1 + 20 // 5 and pipelined.stats["acceptance_per_round"] == []


def test_auto_decodes_small_batches_with_exact_and_large_ones_with_ar(pipe):
    """Lossless either way; the statistics say which decoded, and the codes are that decoding's own."""
    for images, exact_max_batch, chosen in [(1, None, "exact"), (4, None, "ar"), (4, 4, "exact"), (1, 0, "ar")]:
        options = {} if exact_max_batch is None else {"exact_max_batch": exact_max_batch}
        out = run(pipe, decoding="auto", num_images_per_prompt=images, output_type="latent", **options)
        assert out.stats["strategy"] == "auto" and out.stats["chosen_decoding"] == chosen, (images, exact_max_batch)
        same = run(pipe, decoding=chosen, num_images_per_prompt=images, output_type="latent")
        assert torch.equal(out.codes, same.codes) and out.stats["forward_passes"] == same.stats["forward_passes"]
        assert same.stats["chosen_decoding"] == chosen  # every decoding names itself
    wide = run(pipe, decoding="auto", window=5, output_type="latent")
    assert torch.equal(wide.codes, run(pipe, decoding="exact", window=5, output_type="latent").codes)


def test_tuple_output_and_batches_of_prompts(pipe):
    images, codes, stats, final_round, interrupted, rows, warnings = pipe(
        ["a red circle", "blue"], num_images_per_prompt=2, return_dict=False
    )
    assert len(images) == 4 and codes.shape == final_round.shape == (4, 4, 4) and stats["images"] == 4
    assert not interrupted and rows == 4 and warnings == []


def test_output_says_what_was_cut_from_the_prompt(pipe):
    """The caller (a web page, a node) sees what the tokenizer dropped; a log is not enough."""
    long_prompt = " ".join(["red"] * 400)  # 400 tokens, within the characters a 234-token prompt can span
    with pytest.warns(UserWarning, match="only the first"):
        out = pipe([long_prompt, "blue"], num_images_per_prompt=2, output_type="latent")
    assert len(out.warnings) == 1, out.warnings  # said once, though two images share the prompt
    assert "this model reads at most" in out.warnings[0] and len(out.warnings[0]) < 300


@pytest.mark.parametrize(
    "decoding, options", [("ar", {}), ("ssd", {"vertical_rows": 2}), ("ssd", {"window": 5}), ("exact", {})]
)
def test_callback_after_each_row_can_stop_early(pipe, decoding, options):
    """An interrupted image is marked: undecoded rows are -1 in codes and final_round, and black in pixels,
    even where a two-row block had already drafted the row after the last one reported."""
    seen = []

    def on_step_end(p, row, timestep, tensors):
        seen.append((row, tensors["codes"].clone()))
        if row == 0:
            p._interrupt = True
        return {}

    out = run(pipe, decoding=decoding, callback_on_step_end=on_step_end, output_type="np", **options)
    assert [r for r, _ in seen] == [0]
    assert out.interrupted and out.rows_completed == out.stats["rows_completed"] == 1 and out.stats["interrupted"]
    assert (out.codes[:, 1:] == -1).all() and (out.final_round[:, 1:] == -1).all()
    assert (out.codes[:, :1] >= 0).all() and (out.final_round[:, :1] >= 0).all()
    assert torch.equal(seen[0][1], out.codes)  # the callback saw row 0 and nothing below it
    assert (out.images[:, 4:] == 0).all() and out.images[:, :4].any()  # a code row is 4 pixel rows
    again = run(pipe, decoding=decoding, **options)  # the next call starts afresh
    assert again.rows_completed == 4 and not again.interrupted and (again.codes >= 0).all()


def test_decode_codes_masks_what_was_not_decoded(pipe):
    codes = run(pipe, output_type="latent").codes
    full = pipe.decode_codes(codes, output_type="np")
    torch.testing.assert_close(torch.from_numpy(full), torch.from_numpy(run(pipe, output_type="np").images))
    codes[:, 2:] = -1
    partial = pipe.decode_codes(codes, output_type="np")
    assert (partial[:, 8:] == 0).all() and partial[:, :8].any()
    assert len(pipe.decode_codes(codes)) == 1  # PIL images by default
    with pytest.raises(ValueError, match="unknown output_type 'latent'"):
        pipe.decode_codes(codes, output_type="latent")


def test_progress_bar_counts_rows(pipe, capsys):
    pipe.set_progress_bar_config(disable=False)
    run(pipe)
    assert "4/4" in capsys.readouterr().err


def test_loading_heads_into_a_pipeline_without_them(tmp_path):
    bare = tiny_pipeline(with_heads=False)
    with pytest.raises(ValueError, match="needs drafting heads and this pipeline has none"):
        run(bare)
    tiny_heads(tiny_backbone(rows=4, cols=4, codebook_size=8)).save_pretrained(tmp_path / "heads")
    bare.load_heads(tmp_path / "heads")
    assert run(bare, decoding="ssd").stats["strategy"] == "ssd"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": ""}, "must be a non-empty string"),
        ({"prompt": []}, "must be a non-empty string"),
        ({"height": 64, "width": 64}, "makes 16x16 images only"),
        ({"decoding": "medusa"}, "unknown decoding 'medusa'"),
        ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
        ({"output_type": "jpeg"}, "unknown output_type 'jpeg'"),
        ({"negative_prompt": ["x", "y"]}, "pass one per prompt"),
        ({"num_images_per_prompt": 0}, "`num_images_per_prompt` must be an integer >= 1, got 0"),
        ({"callback_on_step_end_tensor_inputs": ["latents"]}, r"\['latents'\] are not available"),
        ({"prompt": 123}, "must be a non-empty string or a list of them, got 123"),
        ({"prompt": ["a", 7]}, "must be a non-empty string or a list of them"),
        ({"negative_prompt": 5}, "`negative_prompt` must be a string or a list of strings, got 5"),
        ({"num_images_per_prompt": 1.5}, "`num_images_per_prompt` must be an integer >= 1, got 1.5"),
        ({"decoding": "ssd", "verify_rounds": 2.5}, "`verify_rounds` must be an integer >= 0"),
        ({"decoding": "ssd", "verify_rounds": -1}, "`verify_rounds` must be an integer >= 0"),
        (
            {"decoding": "ssd", "vertical_rows": 3},
            r"vertical_rows must be in 1..2 \(the heads' vertical offsets\), got 3",
        ),
        ({"height": 0}, "`height` must be an integer >= 1 or None for the model's own size, got 0"),
        ({"width": 16.0}, "`width` must be an integer >= 1"),
        ({"generator": [torch.Generator()] * 2}, "`generator` must be one torch.Generator .* or a list of 1"),
        ({"generator": "seed"}, "`generator` must be one torch.Generator for the whole batch"),
        ({"decoding": "exact", "verify_rounds": 2}, "verify_rounds applies to decoding='ssd' only, not 'exact'"),
        ({"decoding": "ar", "verify_rounds": 1}, "verify_rounds applies to decoding='ssd' only, not 'ar'"),
        ({"decoding": "exact", "vertical_rows": 2}, "vertical_rows applies to decoding='ssd' only, not 'exact'"),
        (
            {"decoding": "ar", "window": 4},
            "window applies to decoding='ssd' or 'exact' or 'auto' only, not 'ar': drop window.",
        ),
        ({"decoding": "exact", "window": 0}, "`window` must be an integer >= 1 for decoding='exact'"),
        ({"decoding": "exact", "exact_max_batch": 2}, "exact_max_batch applies to decoding='auto' only, not 'exact'"),
        ({"decoding": "auto", "exact_max_batch": -1}, "`exact_max_batch` must be an integer >= 0 for decoding='auto'"),
        ({"decoding": "auto", "exact_max_batch": 2.5}, "`exact_max_batch` must be an integer >= 0"),
        ({"guidance_scale": float("nan")}, "guidance_scale must be a finite number, got nan"),
        ({"guidance_scale": float("inf")}, "guidance_scale must be a finite number, got inf"),
        ({"guidance_scale": 1e308}, r"guidance_scale must lie in \[1, 10000\] \(1 disables .*\), got 1e\+308"),
        (
            {"decoding": "exact", "window": 10**6},
            r"window=1000000 is wider than the whole image, 20 positions \(4 rows of 5\): pass at most 20,",
        ),
        ({"decoding": "ssd", "window": 21}, r"window=21 is wider than the whole image, 20 positions"),
        ({"decoding": "auto", "window": 10**9}, r"window=1000000000 is wider than the whole image"),
        ({"num_images_per_prompt": 10**12}, r"1000000000000 images need at least .* pass at most \d+ images a call"),
        ({"temperature": float("nan")}, "temperature must be a finite number, got nan"),
        ({"top_p": float("nan")}, "top_p must be a finite number"),
        ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
        ({"top_k": 2.5}, "top_k must be a positive integer or None"),
    ],
)
def test_bad_input_says_what_to_change(pipe, kwargs, message):
    kwargs = {"prompt": "a red circle", **kwargs}
    with pytest.raises(ValueError, match=message):
        pipe(**kwargs)


def test_heads_of_another_shape_are_refused(pipe, tmp_path):
    tiny_heads(tiny_backbone(rows=4, cols=4, codebook_size=8, hidden_size=16)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"heads expect .* \(16, 16, 8\), the backbone has \(32, 32, 8\)"):
        pipe.load_heads(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "pickle"])
def test_damaged_or_pickled_weights_are_refused(pipe, tmp_path, damage):
    pipe.save_pretrained(tmp_path)
    weights = tmp_path / "heads" / "diffusion_pytorch_model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
        message = "could not load the pipeline .* re-download them"
    else:
        weights.unlink()
        torch.save(pipe.heads.state_dict(), tmp_path / "heads" / "diffusion_pytorch_model.bin")
        message = "could not load the pipeline"
    with pytest.raises(ValueError, match=message):
        SSDAutoregressivePipeline.from_pretrained(tmp_path)


def test_a_folder_that_is_neither_pipeline_nor_heads(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="neither an SSD pipeline"):
        SSDAutoregressivePipeline.from_pretrained(tmp_path)


def test_a_long_prompt_is_cut_with_a_warning(pipe):
    """16 cells + 4 end-of-line tokens, BOS and BOI leave 256 - 22 = 234 positions for the prompt."""
    long = " ".join(["red"] * 300)
    with pytest.warns(UserWarning, match="has 300 tokens and this model reads at most 234"):
        cut = pipe(long, generator=torch.Generator().manual_seed(0), output_type="latent")
    kept = pipe(" ".join(["red"] * 234), generator=torch.Generator().manual_seed(0), output_type="latent")
    assert torch.equal(cut.codes, kept.codes)


def test_a_prompt_of_unknown_words_warns(pipe):
    with pytest.warns(UserWarning, match="3 of the 4 words of the prompt 'a zebra on skis' are unknown"):
        pipe("a zebra on skis", output_type="latent")


REFERENCE_MODEL = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"


@pytest.fixture(scope="module")
def reference():
    pipe = SSDAutoregressivePipeline.from_pretrained(REFERENCE_MODEL)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize(
    "prompt, dropped",
    [
        (
            "a redcircle",
            (
                "1 of the 2 words of the prompt 'a redcircle' are unknown to this model's tokenizer and "
                "were dropped: 'redcircle'."
            ),
        ),
        (
            "a red\x00circle",
            (
                "1 of the 2 words of the prompt 'a red\\x00circle' are unknown to this model's "
                "tokenizer and were dropped: 'red\\x00circle'."
            ),
        ),
        (
            "a red circle left of a bleu square",
            (
                "1 of the 8 words of the prompt 'a red circle left of a bleu square' "
                "are unknown to this model's tokenizer and were dropped: 'bleu'."
            ),
        ),
    ],
)
def test_every_dropped_word_is_named_even_when_most_are_known(reference, prompt, dropped):
    """Issue 56: "a redcircle" became [a, <unk>] without a word, unless more than half the words were unknown."""
    with pytest.warns(UserWarning) as warned:
        out = reference(prompt, output_type="latent", num_images_per_prompt=1, decoding="ar")
    expected = f"{dropped} Use words the model was trained on."
    assert out.warnings == [expected] and [str(w.message) for w in warned] == [expected]


def test_a_prompt_no_model_reads_whole_is_refused_before_tokenizing(reference, monkeypatch):
    """Issue 56: a 20 MB prompt took 98 s to tokenize before anything said no."""
    limit = reference.max_prompt_chars
    assert limit == 14 * (max(map(len, reference.tokenizer.get_vocab())) + 1)  # 14 tokens of the longest word + space
    called = []
    monkeypatch.setattr(type(reference.tokenizer), "__call__", lambda *a, **k: called.append(a) or 1 / 0)
    huge = "a red circle " * 1_600_000  # 20.8 MB
    for kwargs, what in (
        ({"prompt": huge}, "prompt"),
        ({"prompt": "a red circle", "negative_prompt": huge}, "negative prompt"),
    ):
        with pytest.raises(ValueError) as caught:
            reference(**kwargs, output_type="latent")
        assert str(caught.value) == (
            f"the {what} {huge[:57] + '...'!r} has {len(huge):,} characters, and this model reads at most "
            f"{limit:,} (max_prompt_chars): shorten it."
        )
    assert called == []
    monkeypatch.undo()
    spaced = "a    red   circle   " * 8  # long, but its words fit: runs of whitespace count as one
    assert len(spaced) > limit and reference(spaced, output_type="latent", decoding="ar").codes.shape == (1, 16, 16)


@pytest.mark.parametrize(
    "decoding, options, cap", [("ssd", {"verify_rounds": 1}, 1), ("ssd", {}, 2), ("exact", {}, None), ("ar", {}, None)]
)
def test_stats_say_where_a_cap_left_resamples_unchecked(pipe, decoding, options, cap):
    """The acceptance maps of every face read the cap from here (red: resampled in the last round)."""
    out = pipe("a red circle", decoding=decoding, output_type="latent", **options)
    assert out.stats["round_cap"] == cap
    if cap is not None:
        assert int(out.final_round.max()) <= cap + 1


@pytest.mark.parametrize("callback", [5, "print"])
def test_a_callback_that_cannot_be_called_is_refused_before_any_pass(pipe, callback, monkeypatch):
    """Issue 56: `callback_on_step_end=5` failed with "'int' object is not callable" after the first row."""
    monkeypatch.setattr(type(pipe.image_backbone), "prefill", lambda *a, **k: 1 / 0)  # no pass may run
    with pytest.raises(ValueError) as caught:
        pipe("a red circle", callback_on_step_end=callback, output_type="latent")
    assert str(caught.value) == (
        "callback_on_step_end must be a function called as callback(pipe, step, timestep, tensors), or None, "
        f"got {callback!r} ({type(callback).__name__})."
    )
