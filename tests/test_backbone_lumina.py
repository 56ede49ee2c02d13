"""Lumina-mGPT on transformers' Chameleon: our AR decoding against Lumina-mGPT's published logits processing.

The reference below follows the description of Lumina-mGPT's `inference_solver.py`
(Alpha-VLLM/Lumina-mGPT): after the image start and the two size tokens, the
unconditional context is those three tokens plus what was generated; guidance is
`scale * (cond - uncond) + uncond` on the raw logits; at a row's end only the
end-of-line token is allowed, elsewhere only image tokens. It runs full
sequences through the model without a cache, independent of our code path.
"""

import pytest
import torch
from tiny_backbones import tiny_lumina

from ssd_pipelines import ARDecoding, SamplingConfig
from ssd_pipelines.backbones import LuminaMGPTBackbone

PROMPTS = ["a red dog", "the blue cat in the rain"]


@pytest.fixture(scope="module")
def lumina():
    model, tokenizer = tiny_lumina()
    return LuminaMGPTBackbone(model, tokenizer, image_size=(64, 96))  # 4 x 6 codes


@torch.no_grad()
def lumina_reference(backbone: LuminaMGPTBackbone, conditional: list[int], unconditional: list[int], scale: float):
    model, grid = backbone.model, backbone.grid
    image_tokens = torch.tensor(model.model.vocabulary_mapping.image_tokens)

    def next_logits(ids: list[int]) -> torch.Tensor:  # the head on the last hidden state, unmasked
        return model.lm_head(model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1])

    generated = []
    for step in range(grid.rows * (grid.cols + 1)):
        if (step + 1) % (grid.cols + 1) == 0:
            token = backbone.eol_token_id
        else:
            cond, uncond = next_logits(conditional + generated), next_logits(unconditional + generated)
            scores = scale * (cond - uncond) + uncond
            allowed = torch.full_like(scores, float("-inf"))
            allowed[image_tokens] = scores[image_tokens]
            token = int(allowed.argmax())
        generated.append(token)
    rows = torch.tensor(generated).view(grid.rows, grid.cols + 1)[:, :-1]
    bpe2img = model.model.vocabulary_mapping.bpe2img
    return torch.tensor([[bpe2img[int(t)] for t in row] for row in rows])


def test_greedy_ar_is_lumina_mgpts_logits_processing(lumina):
    scale = 4.0
    batch = lumina.encode_prompts(PROMPTS, guidance=True)
    ours = ARDecoding().decode(lumina, batch, SamplingConfig(temperature=0, guidance_scale=scale)).codes
    for i in range(len(PROMPTS)):
        cond, uncond = (batch.input_ids[row][batch.attention_mask[row].bool()].tolist() for row in (i, i + 2))
        assert torch.equal(ours[i], lumina_reference(lumina, cond, uncond, scale))


def test_prompts_force_image_start_and_size_tokens(lumina):
    vocabulary, tokenizer = lumina.vocabulary, lumina.tokenizer
    batch = lumina.encode_prompts(["a red dog"], guidance=True)
    text = "Generate an image of 96x64 according to the following prompt:\na red dog"
    start = [vocabulary[name] for name in ("<racm3:break>", "<reserved08802>", "<reserved08803>")]  # 64 px, 96 px
    expected = [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert batch.input_ids[0].tolist() == [*expected, vocabulary["<reserved08706>"], *start]
    assert batch.input_ids[1][batch.attention_mask[1].bool()].tolist() == start  # Lumina-mGPT's unconditional row
    assert lumina.default_guidance_scale == 4.0


def test_codes_are_tokens_of_the_vocabulary_map_and_transformers_masks_them(lumina):
    mapping = lumina.model.model.vocabulary_mapping
    codes = torch.arange(lumina.grid.codebook_size)
    assert lumina.codes.ids(codes).tolist() == [mapping.img2bpe[c] for c in range(lumina.grid.codebook_size)]
    torch.testing.assert_close(lumina.embed_codes(codes), lumina.decoder.embed_tokens(lumina.codes.ids(codes)))
    ids = lumina.encode_prompts(["a red dog"]).input_ids
    masked = lumina.model(input_ids=ids).logits[0, -1, mapping.image_tokens]
    assert (masked == torch.finfo(masked.dtype).min).all()  # why the adapter applies the head itself
    _state, hidden = lumina.prefill(lumina.encode_prompts(["a red dog"]))
    assert lumina.code_logits(hidden).isfinite().all()


def test_sizes_are_multiples_of_32_pixels_with_size_tokens(lumina):
    grid = lumina.grid_for_size(32, 320)
    assert (grid.rows, grid.cols, grid.eol_token_id) == (2, 20, lumina.vocabulary["<reserved08799>"])
    with pytest.raises(ValueError, match="multiples of 32 pixels, not 48x96"):
        lumina.grid_for_size(48, 96)
    with pytest.raises(ValueError, match="no size token for 352 pixels"):
        lumina.grid_for_size(352, 32)
