"""The testing surface: what the tests and `ssd_bench` build on, named apart from the product.

Here, tiny seeded random components: a Llama grid backbone, its word-level tokenizer, drafting heads, a VQ decoder
and a pipeline of them. Random weights are drawn at a large scale so that the backbone's conditionals are peaked and
depend on context: a verifier with wrong maths then produces a visibly wrong distribution. Beside them:
`exactness` (an enumerable grid's exact AR distribution and the tests against it), `host_syncs` (a counter of what
would block a GPU's host) and `engine_probes` (the one file outside decoding/ that names the engine's private
steps, to time them).
"""

from __future__ import annotations

import torch
from diffusers import VQModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ..backbones import GridTokens, LlamaGridBackbone
from ..heads import DraftHeads
from ..peers.sjd import random_codes
from ..pipeline_ssd import SSDAutoregressivePipeline

SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
WORDS = ["a", "red", "blue", "green", "circle", "square", "left", "of", "the"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )


def tiny_llama(rows=2, cols=3, codebook_size=3, eol=True, seed=0, hidden_size=32, layers=2, init_scale=0.4):
    """A random LlamaForCausalLM with an `image_grid` config. Vocabulary: specials, words, BOI/EOI/EOL, codes."""
    text = len(SPECIALS) + len(WORDS)
    tokens = GridTokens(
        rows=rows,
        cols=cols,
        codebook_size=codebook_size,
        code_offset=text + 3,
        boi_token_id=text,
        eoi_token_id=text + 1,
        eol_token_id=text + 2 if eol else None,
        pixels_per_code=4,
    )
    config = LlamaConfig(
        vocab_size=text + 3 + codebook_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max(256, rows * (cols + int(eol)) + 64),  # the image and a prompt fit
        bos_token_id=2,
        eos_token_id=3,
        pad_token_id=0,
        initializer_range=init_scale,
        image_grid=tokens.to_dict(),
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def tiny_backbone(**kwargs) -> LlamaGridBackbone:
    return LlamaGridBackbone(tiny_llama(**kwargs), tiny_tokenizer())


def flat_backbone(**kwargs) -> LlamaGridBackbone:
    """A tiny backbone whose every conditional is uniform (its final norm is zero), whatever the context.

    Drafts whose q is uniform, as the heads' are on it, then match the target exactly and are always
    accepted: the backbone of "perfect drafts", on which pass counts follow each method's formula.
    """
    backbone = tiny_backbone(**kwargs)
    with torch.no_grad():
        backbone.final_norm.weight.zero_()
    return backbone


def with_uniform_drafts(strategy_class: type) -> type:
    """A window strategy (`peers/window.py`) drafting uniformly random codes with a uniform q: on a
    `flat_backbone` these are the model's own conditionals, so perfect drafts for SJD and GSD too."""

    class UniformDrafts(strategy_class):
        def draft(self, front, images, cells):
            codebook = front.grid.codebook_size
            codes = random_codes(len(cells), codebook, front.run.generator, cells.device, images)
            front.set_drafts(images, cells, codes, torch.full((len(cells), codebook), 1 / codebook))

    UniformDrafts.__name__ = f"{strategy_class.__name__}WithUniformDrafts"
    return UniformDrafts


def tiny_heads(
    backbone: LlamaGridBackbone,
    seed: int = 1,
    horizontal=(1, 2, 3, 4, 5),
    vertical=None,
    drafter: str = "cell",
    row_kernel: int = 5,
    left_codes: int = 2,
) -> DraftHeads:
    """Random heads; vertical offsets (1, 2) for the per-cell drafter, (1,) for the row kinds."""
    torch.manual_seed(seed)
    return DraftHeads(
        hidden_size=backbone.hidden_size,
        embed_size=backbone.embed_size,
        codebook_size=backbone.grid.codebook_size,
        horizontal_offsets=horizontal,
        vertical_offsets=vertical if vertical is not None else ((1, 2) if drafter == "cell" else (1,)),
        base_model=None,  # random heads: distilled from no model, so no pipeline warns that they name another
        vertical_drafter=drafter,
        row_kernel=row_kernel,
        left_codes=left_codes,
    ).eval()


def tiny_vqvae(codebook_size: int = 8, seed: int = 0) -> VQModel:
    """A random diffusers VQModel decoding a code into 4 x 4 pixels (two downsampling stages)."""
    torch.manual_seed(seed)
    return VQModel(
        block_out_channels=(8, 8, 8),
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        latent_channels=4,
        num_vq_embeddings=codebook_size,
        norm_num_groups=4,
        sample_size=16,
    ).eval()


def tiny_pipeline(rows: int = 4, cols: int = 4, codebook_size: int = 8, with_heads: bool = True):
    """An SSDAutoregressivePipeline of tiny random components."""
    backbone = tiny_backbone(rows=rows, cols=cols, codebook_size=codebook_size)
    heads = tiny_heads(backbone) if with_heads else None
    pipe = SSDAutoregressivePipeline(backbone.model, backbone.tokenizer, tiny_vqvae(codebook_size), heads)
    pipe.set_progress_bar_config(disable=True)
    return pipe
