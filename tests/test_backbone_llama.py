import pytest
import torch

from ssd_pipelines import LlamaGridBackbone
from ssd_pipelines.decoding.block import Block
from ssd_pipelines.testing import tiny_llama, tiny_tokenizer


def full_sequence(backbone, prompt_ids, codes):
    """[BOS, prompt, BOI, row codes + EOL ...] as vocabulary ids."""
    t = backbone.tokens
    ids = [backbone.model.config.bos_token_id, *prompt_ids, t.boi_token_id]
    for row in codes.view(backbone.grid.rows, backbone.grid.cols).tolist():
        ids += [c + t.code_offset for c in row] + ([t.eol_token_id] if t.eol_token_id is not None else [])
    return torch.tensor([ids])


@pytest.mark.parametrize("eol", [True, False])
def test_hidden_states_from_one_pass_give_the_models_own_logits(eol):
    backbone = LlamaGridBackbone(tiny_llama(rows=3, cols=4, codebook_size=6, eol=eol), tiny_tokenizer())
    codes = torch.randint(0, 6, (12,))
    prompts = backbone.encode_prompts(["a red circle"])
    state, h_first = backbone.prefill(prompts)
    block = Block(backbone.grid, 0, 12)
    hidden = backbone.extend(state, block.embed(backbone, codes[None]))
    ours = backbone.code_logits(block.predicting_hidden(h_first, hidden))  # [1, 12, K]

    sequence = full_sequence(backbone, backbone.prompt_token_ids("a red circle"), codes)
    logits = backbone.model(sequence).logits[0]
    image_start = prompts.input_ids.shape[1] - 1  # the BOI position predicts cell 0
    positions = image_start + block.cell_positions()
    t = backbone.tokens
    torch.testing.assert_close(ours[0], logits[positions, t.code_offset : t.code_offset + 6], atol=1e-4, rtol=1e-4)


def test_left_padding_does_not_change_a_prompts_states(backbone):
    alone = backbone.encode_prompts(["a"])
    padded = backbone.encode_prompts(["a", "a red circle left of the blue square"])
    assert padded.attention_mask[0].tolist()[:3] == [0, 0, 0]
    codes = torch.randint(0, 8, (1, 7))
    block = Block(backbone.grid, 0, 7)  # crosses a row end: an end-of-line token inside
    results = []
    for prompts in (alone, padded):
        state, h_first = backbone.prefill(prompts)
        hidden = backbone.extend(state, block.embed(backbone, codes.expand(prompts.input_ids.shape[0], -1)))
        results.append(block.predicting_hidden(h_first, hidden)[0])
    torch.testing.assert_close(results[0], results[1], atol=1e-4, rtol=1e-4)  # a wrong position differs by O(1)


def test_unconditional_rows_keep_bos_and_boi_and_pad_the_prompt(backbone):
    batch = backbone.encode_prompts(["red circle", "blue"], num_images_per_prompt=2, guidance=True)
    ids = batch.input_ids.tolist()
    bos, pad, boi = 2, 0, backbone.tokens.boi_token_id
    red, circle = backbone.prompt_token_ids("red circle")
    assert batch.batch_size == 4 and len(ids) == 8
    assert ids[0] == ids[1] == [bos, red, circle, boi]
    assert ids[4] == ids[5] == [bos, pad, pad, boi]
    assert batch.attention_mask[6].tolist() == [0, 1, 1, 1]


def test_negative_prompts_fill_the_unconditional_rows(backbone):
    batch = backbone.encode_prompts(["red circle"], negative_prompts=["blue"], guidance=True)
    assert batch.input_ids[1, -2] == backbone.prompt_token_ids("blue")[0]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda b: b.encode_prompts([]), "non-empty list of strings"),
        (lambda b: b.encode_prompts("a red circle"), "non-empty list of strings"),
        (lambda b: b.encode_prompts(["a"], num_images_per_prompt=0), "num_images_per_prompt must be >= 1"),
        (lambda b: b.encode_prompts(["a", "b"], negative_prompts=["c"], guidance=True), "pass one per prompt"),
        (lambda b: b.encode_prompts(["a"], negative_prompts=["c"]), "set guidance_scale > 1"),
        (lambda b: b.grid_for_size(64, 64), r"makes 16x20 images only .* pass height=16, width=20"),
    ],
)
def test_bad_requests_say_what_to_change(backbone, call, message):
    with pytest.raises(ValueError, match=message):
        call(backbone)


def test_native_size_resolves_to_the_grid(backbone):
    assert backbone.grid_for_size(16, 20) == backbone.grid_for_size() == backbone.grid


def test_a_llama_without_an_image_grid_is_refused():
    model = tiny_llama()
    del model.config.image_grid
    with pytest.raises(ValueError, match="no `image_grid` in its config"):
        LlamaGridBackbone(model)


def test_codes_outside_the_vocabulary_are_refused():
    model = tiny_llama()
    model.config.image_grid = {**model.config.image_grid, "codebook_size": 500}
    with pytest.raises(ValueError, match="do not fit a vocabulary"):
        LlamaGridBackbone(model)


def test_an_older_transformers_is_refused_rather_than_decoding_without_context():
    from ssd_pipelines.backbones.causal_lm import check_transformers_version

    with pytest.raises(RuntimeError, match=r"needs transformers>=5.24 .* found 5.17.0: pip install -U"):
        check_transformers_version("5.17.0")
    check_transformers_version("5.24.0")
