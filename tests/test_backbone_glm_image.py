"""GLM-Image's AR stage as a backbone (issue 54, part 1): our decodings against
`GlmImageForConditionalGeneration.generate`, on a tiny random configuration of the real classes, saved and reloaded
from disk like a Hub snapshot."""

import threading

import pytest
import torch
from transformers import GlmImageForConditionalGeneration, GlmImageProcessor

from ssd_pipelines import ARDecoding, ExactDecoding, SamplingConfig, SSDDecoding
from ssd_pipelines.backbones.glm_image import GlmImageBackbone, target_grids
from ssd_pipelines.testing import tiny_heads
from ssd_pipelines.testing.exactness import grid_probabilities, measure
from ssd_pipelines.tiny_glm_image import glm_processor, save_tiny_glm_image, tiny_glm_ar

PROMPTS = ["a red dog", "the blue cat in the rain"]
SIZE = (64, 96)  # a 2 x 3 large grid after a 13 x 19 preview
GREEDY = SamplingConfig(temperature=0.0, guidance_scale=1.0)


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    folder = save_tiny_glm_image(tmp_path_factory.mktemp("glm_image"))
    model = GlmImageForConditionalGeneration.from_pretrained(folder / "vision_language_encoder").eval()
    processor = GlmImageProcessor.from_pretrained(folder / "processor")
    return GlmImageBackbone(model, processor, image_size=SIZE)


def both_grids(strategy, glm, prompts, sampling=GREEDY, generator=None):
    """The preview grid, then the large grid after it: GLM-Image's prior tokens, as two decodings."""
    batch = glm.encode_prompts(prompts, grid=glm.grid)
    preview = strategy.decode(glm, batch, sampling, generator, grid=batch.grid)
    large_batch = glm.after_preview(batch, preview.codes)
    large = strategy.decode(glm, large_batch, sampling, generator, grid=large_batch.grid)
    return preview, large


def generated(glm, prompt):
    """The stock model's greedy prior tokens for one prompt: preview then large grid (its end token dropped)."""
    preview, large = glm.grids_for_size(*SIZE)
    inputs = glm.processor.apply_chat_template(
        [[{"role": "user", "content": [{"type": "text", "text": prompt}]}]],
        tokenize=True,
        processor_kwargs={"target_h": SIZE[0], "target_w": SIZE[1]},
        return_dict=True,
        return_tensors="pt",
    )
    cells = preview.num_cells + large.num_cells
    out = glm.model.generate(**inputs, max_new_tokens=cells + 1, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :][:cells]


def test_the_grids_are_the_processors():
    for height in range(32, 2049, 96):
        for width in range(32, 2049, 160):
            rows, cols, preview_rows, preview_cols = GlmImageProcessor._get_target_shape(None, height, width)
            assert target_grids(height, width) == ((rows, cols), (preview_rows, preview_cols)), (height, width)


def test_greedy_ar_gives_the_tokens_of_generate(glm):
    """Both grids, each cell at its 3D position: a position off by a row or a grid changes the codes."""
    preview, large = both_grids(ARDecoding(), glm, PROMPTS)
    assert preview.codes.shape == (2, 13, 19) and large.codes.shape == (2, 2, 3)
    for b, prompt in enumerate(PROMPTS):
        expected = generated(glm, prompt)
        ours = torch.cat([preview.codes[b].flatten(), large.codes[b].flatten()])
        assert torch.equal(ours, expected), b
    assert preview.stats.forward_passes == 13 * 19 and large.stats.forward_passes == 2 * 3


@pytest.mark.parametrize("drafter", ["cell", "recurrent"])
def test_greedy_exact_and_uncapped_ssd_equal_greedy_ar(glm, drafter):
    heads = tiny_heads(glm, drafter=drafter)
    expected = [out.codes for out in both_grids(ARDecoding(), glm, PROMPTS)]
    for strategy in (ExactDecoding(heads), SSDDecoding(heads, verify_rounds=None)):
        got = both_grids(strategy, glm, PROMPTS)
        for grid, want, out in zip(("preview", "large"), expected, got):
            assert torch.equal(out.codes, want), (type(strategy).__name__, grid)


def test_positions_are_the_cells_not_the_models_state(glm):
    """transformers keeps GLM-Image's decode positions on the model between calls; the adapter never reads them, so
    concurrent calls of other prompts and sizes on one loaded model give each its own codes."""
    expected = {prompt: both_grids(ARDecoding(), glm, [prompt])[1].codes for prompt in PROMPTS}
    results, errors = {}, []

    def call(prompt):
        try:
            for _ in range(2):
                results[prompt] = both_grids(ARDecoding(), glm, [prompt])[1].codes
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(p,)) for p in PROMPTS]
    glm.model.model._cached_decode_position_ids = torch.full((1, 3, 400), 7)  # what a stale generate left
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for prompt in PROMPTS:
        assert torch.equal(results[prompt], expected[prompt]), prompt


def test_sizes_the_processor_cannot_make_are_refused_with_what_to_pass(glm):
    with pytest.raises(
        ValueError, match=r"multiples of 32 px .* got 100x96: pass height and width that are, e\.g\. 96x96"
    ):
        glm.grid_for_size(100, 96)
    assert glm.grid_for_size(1024, 1024).rows == 32
    assert glm.grids_for_size(1024, 1024)[0].num_cells == 256


def test_exact_samples_the_large_grids_ar_distribution_after_a_preview():
    """The G test on an enumerable large grid (2 x 2 of 3 codes: 81 images) after a fixed preview: `exact`'s passes
    (cells at their window's positions, through extend_rows) against the exact AR probabilities (the grid
    teacher-forced in one pass, through extend). After 256 preview codes the four cells depend on each other only a
    little, so this checks GLM-Image's sampling path end to end; the verification's power against lossy rules is
    tests/test_decoding_distribution.py's."""
    glm = GlmImageBackbone(tiny_glm_ar(codebook_size=3, seed=1), glm_processor(3), image_size=(64, 64))
    preview = (torch.arange(256) % 3).view(1, 16, 16)

    def encode(images, guidance):
        batch = glm.encode_prompts(["a red dog"], num_images_per_prompt=images, guidance=guidance, grid=glm.grid)
        return glm.after_preview(batch, preview.expand(images, -1, -1))

    sampling = SamplingConfig(temperature=1.0, guidance_scale=1.0)
    probs = grid_probabilities(glm, encode, sampling)
    assert probs.shape == (81,) and abs(float(probs.sum()) - 1) < 1e-4
    g = measure(ExactDecoding(tiny_heads(glm), window=3), glm, sampling, 2000, 0, probs, prompt=encode).g
    assert g.passes, g
