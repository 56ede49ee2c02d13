"""Emu3: our AR decoding against `Emu3ForConditionalGeneration.generate` with its documented prefix constraint, and
its grouped-query attention over the unrepeated cache under compiled passes (issue 51, point 5)."""

import warnings
from types import SimpleNamespace

import pytest
import torch
import transformers.integrations.sdpa_attention as stock_sdpa
from tiny_backbones import tiny_emu3
from transformers import LlamaConfig, LlamaModel

from ssd_pipelines import ARDecoding, SamplingConfig
from ssd_pipelines.backbones import Emu3Backbone
from ssd_pipelines.backbones.grouped_attention import GROUPED_SDPA, fold_query_groups, grouped_sdpa_forward
from ssd_pipelines.testing.host_syncs import count_host_syncs

PROMPTS = ["a red dog", "the blue cat in the rain"]


@pytest.fixture(scope="module")
def emu3():
    model, tokenizer = tiny_emu3()
    return Emu3Backbone(model, tokenizer, image_size=(6, 8))  # 3 x 4 codes


def prefix_allowed_tokens_fn(backbone: Emu3Backbone):
    """The constraint of the transformers Emu3 docs: codes, end-of-line after each row, then EOF, EOI, EOS."""
    vocabulary, rows, cols = backbone.model.config.vocabulary_map, backbone.grid.rows, backbone.grid.cols
    codes = backbone.model.vocabulary_mapping.image_tokens

    def allowed(batch_id, input_ids):
        offset = input_ids.shape[0] - torch.nonzero(input_ids == backbone.image_wrapper_token_id)[0, 0]
        if offset % (cols + 1) == 0:
            return [backbone.eol_token_id]
        for extra, name in enumerate(("<|extra_201|>", "<|image end|>", "<eos>"), start=1):
            if offset == (cols + 1) * rows + extra:
                return [vocabulary[name]]
        return codes

    return allowed


def generate(backbone: Emu3Backbone, prompt: str, negative: str | None, guidance: float) -> torch.Tensor:
    """Emu3's own greedy image: [rows, cols] codes and the three tokens after the last row."""
    batch = backbone.encode_prompts([prompt], None if negative is None else [negative], guidance=True)
    rows, cols = backbone.grid.rows, backbone.grid.cols
    sequence = backbone.model.generate(
        input_ids=batch.input_ids[:1],
        attention_mask=batch.attention_mask[:1],
        negative_prompt_ids=batch.input_ids[1:],  # UnbatchedClassifierFreeGuidanceLogitsProcessor: a second forward
        negative_prompt_attention_mask=batch.attention_mask[1:],
        guidance_scale=guidance,
        prefix_allowed_tokens_fn=prefix_allowed_tokens_fn(backbone),
        do_sample=False,
        max_new_tokens=rows * (cols + 1) + 3,
    )
    return sequence[0, batch.input_ids.shape[1] :]


@pytest.mark.parametrize("negatives", [None, ["blue rain", "a dog"]])
def test_greedy_ar_is_the_models_own_constrained_generation(emu3, negatives):
    guidance = 3.0
    batch = emu3.encode_prompts(PROMPTS, negatives, guidance=True)  # batched, left-padded, guidance batched too
    ours = ARDecoding().decode(emu3, batch, SamplingConfig(temperature=0, guidance_scale=guidance)).codes
    mapping = emu3.model.vocabulary_mapping
    for i, prompt in enumerate(PROMPTS):
        tokens = generate(emu3, prompt, None if negatives is None else negatives[i], guidance)
        rows = tokens[:-3].view(emu3.grid.rows, emu3.grid.cols + 1)
        assert (rows[:, -1] == emu3.eol_token_id).all()
        assert torch.equal(mapping.convert_bpe2img(rows).long(), ours[i])
        pixels = emu3.model.decode_image_tokens(image_tokens=tokens[None], height=emu3.grid.rows, width=emu3.grid.cols)
        torch.testing.assert_close(emu3.decode_codes(ours[i : i + 1]), ((pixels + 1) / 2).clamp(0, 1))


def test_prompts_end_with_the_processors_size_prefix(emu3):
    batch = emu3.encode_prompts(["a red dog"], guidance=True)
    tokenizer = emu3.tokenizer
    size = [emu3.image_start_token_id, *tokenizer("3*4", add_special_tokens=False)["input_ids"]]
    size.append(emu3.image_wrapper_token_id)
    text = tokenizer("a red dog", add_special_tokens=False)["input_ids"]
    assert batch.input_ids[0].tolist() == [tokenizer.bos_token_id, *text, *size]
    assert batch.input_ids[1][batch.attention_mask[1].bool()].tolist() == [tokenizer.bos_token_id, *size]
    assert emu3.grid.eol_token_id == emu3.model.vocabulary_mapping.eol_token_id and emu3.default_guidance_scale == 3.0


def test_sizes_are_multiples_of_the_vq_models_code(emu3):
    assert (emu3.grid_for_size(4, 10).rows, emu3.grid_for_size(4, 10).cols) == (2, 5)
    with pytest.raises(ValueError, match="multiples of 2 pixels, not 5x8: pass e.g. height="):
        emu3.grid_for_size(5, 8)
    with pytest.raises(ValueError, match="reads at most 512"):
        emu3.grid_for_size(64, 64)


def test_the_end_of_line_embedding_is_read_without_a_copy_from_the_host(emu3):
    """Every frontier pass of Emu3 and Lumina-mGPT embeds the end-of-line token: a pageable copy would block the
    host on a GPU each pass."""
    with count_host_syncs() as syncs:
        embed = emu3.embed_token(emu3.eol_token_id)
    assert syncs.total == 0, syncs.summary()
    torch.testing.assert_close(embed, emu3.decoder.embed_tokens.weight[emu3.eol_token_id])


@pytest.mark.parametrize("queries", [1, 5])
def test_grouped_attention_is_transformers_sdpa_over_repeated_kv(queries):
    """Queries folded into their KV head's row against transformers' own sdpa, which repeats K/V (a mask and GQA):
    a head read against another head's K/V, or a mask row against another query, would differ. No host syncs."""
    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=4, is_causal=True)
    query, key, value = torch.randn(2, 8, queries, 16), torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    hidden = torch.rand(2, 1, queries, 40) < 0.3
    hidden[..., 0] = False  # each query sees a key
    mask = torch.zeros(hidden.shape).masked_fill_(hidden, torch.finfo(torch.float32).min)
    with count_host_syncs() as syncs:
        ours, _ = grouped_sdpa_forward(module, query, key, value, mask, scaling=0.3)
    assert syncs.total == 0, syncs.summary()
    stock, _ = stock_sdpa.sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert ours.shape == (2, queries, 8, 16)
    torch.testing.assert_close(ours, stock, rtol=1e-5, atol=1e-6)


def counting_repeat_kv(monkeypatch) -> torch.Tensor:
    """transformers' `repeat_kv`, counting its calls into the tensor returned: in place, so that a compiled graph
    counts too (a Python counter would be guarded on, and recompiled for, at every call)."""
    calls, repeat_kv = torch.zeros((), dtype=torch.long), stock_sdpa.repeat_kv

    def counted(hidden_states, n_rep):
        calls.add_(1)
        return repeat_kv(hidden_states, n_rep)

    monkeypatch.setattr(stock_sdpa, "repeat_kv", counted)
    return calls


def test_compiled_static_passes_attend_over_the_unrepeated_cache_and_give_eager_codes(monkeypatch):
    """Left-padded prompts with guidance: every pass takes a 4-D mask, with which transformers' sdpa repeats K/V."""
    model, tokenizer = tiny_emu3()
    emu3 = Emu3Backbone(model, tokenizer, image_size=(6, 8))
    assert emu3.decoder.config.num_key_value_heads < emu3.decoder.config.num_attention_heads
    batch = emu3.encode_prompts(PROMPTS, guidance=True)
    sampling = SamplingConfig(temperature=0, guidance_scale=3.0)
    calls = counting_repeat_kv(monkeypatch)
    eager = ARDecoding().decode(emu3, batch, sampling).codes
    assert calls > 0, "the eager decode repeats no K/V: transformers' sdpa changed, and this test checks nothing"
    calls.zero_()
    emu3.compile_passes({"backend": "eager", "dynamic": False})
    try:
        assert emu3.decoder.config._attn_implementation == GROUPED_SDPA
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no fallback: the compiled passes ran
            compiled = ARDecoding().decode(emu3, batch, sampling).codes
        assert emu3.runner.active and emu3.runner.static
    finally:
        emu3.compile_passes(None)
    assert calls == 0
    assert torch.equal(compiled, eager)
    assert emu3.decoder.config._attn_implementation == "sdpa"
    assert model.model.vqmodel.config._attn_implementation == "sdpa"


def test_a_decoder_without_grouped_heads_keeps_its_attention():
    sizes = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "vocab_size": 8}
    decoder = LlamaModel(LlamaConfig(num_attention_heads=2, num_key_value_heads=2, **sizes))
    fold_query_groups(decoder)
    assert decoder.config._attn_implementation == "sdpa"
