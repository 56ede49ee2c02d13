"""`exact` is lossless: in greedy mode it returns the AR grid token for token."""

import pytest
import torch

from ssd_pipelines import ARDecoding, ExactDecoding, SamplingConfig
from ssd_pipelines.testing import tiny_backbone, tiny_heads

PROMPTS = ["a red circle", "blue square"]  # different lengths: the batch is left-padded


@pytest.mark.parametrize("eol", [True, False], ids=["eol", "no-eol"])
@pytest.mark.parametrize("guidance", [1.0, 3.0], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize("vertical_rows", [1, 2], ids=["kv1", "kv2"])
def test_exact_greedy_equals_ar_greedy(eol, guidance, vertical_rows):
    backbone = tiny_backbone(rows=5, cols=7, codebook_size=8, eol=eol)
    heads = tiny_heads(backbone)
    sampling = SamplingConfig(temperature=0, guidance_scale=guidance)
    prompts = backbone.encode_prompts(PROMPTS, num_images_per_prompt=2, guidance=sampling.uses_guidance)
    ar = ARDecoding().decode(backbone, prompts, sampling)
    exact = ExactDecoding(heads, vertical_rows=vertical_rows).decode(backbone, prompts, sampling)
    assert exact.codes.shape == (4, 5, 7)
    assert torch.equal(exact.codes, ar.codes)
    assert len(set(ar.codes.flatten().tolist())) > 2  # the grid is not trivially constant
    assert exact.stats.rows_completed == ar.stats.rows_completed == 5


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eol", [True, False], ids=["eol", "no-eol"])
def test_exact_greedy_in_bf16_equals_ar_up_to_rounding(seed, eol):
    """A block pass and a one-token pass round differently in bf16, so near-tied argmaxes may swap:
    at most 1 cell in 10 may differ (docs/decoding.md, "In floating point"). In float32 they are identical."""
    backbone = tiny_backbone(rows=5, cols=7, codebook_size=8, eol=eol, seed=seed)
    heads = tiny_heads(backbone)
    backbone.model.to(torch.bfloat16)
    heads.to(torch.bfloat16)
    sampling = SamplingConfig(temperature=0, guidance_scale=3.0)
    prompts = backbone.encode_prompts(PROMPTS, num_images_per_prompt=2, guidance=True)
    ar = ARDecoding().decode(backbone, prompts, sampling)
    exact = ExactDecoding(heads).decode(backbone, prompts, sampling)
    assert (exact.codes != ar.codes).float().mean() <= 0.1


def test_exact_greedy_with_good_heads_needs_one_pass_per_block():
    """Heads that draft the target's argmax are always accepted: the first round is the commit."""
    backbone = tiny_backbone(rows=4, cols=5, codebook_size=8)
    heads = tiny_heads(backbone)
    sampling = SamplingConfig(temperature=0)
    prompts = backbone.encode_prompts(["a"])
    truth = ARDecoding().decode(backbone, prompts, sampling).codes.flatten()
    oracle = OracleHeads(backbone, heads, truth)
    # horizontal_cells=0: the first row goes cell by cell, each drawn from its exact distribution.
    out = ExactDecoding(oracle, horizontal_cells=0).decode(backbone, prompts, sampling)
    assert torch.equal(out.codes.flatten(), truth)
    assert out.stats.forward_passes == 1 + 5 + 3  # prefill, 5 first-row cells, one pass for each later row
    assert out.stats.acceptance_per_round == [1.0]


class OracleHeads(torch.nn.Module):
    """Stands in for perfect heads: drafts hidden states whose argmax code is the AR greedy code."""

    def __init__(self, backbone, heads, truth):
        super().__init__()
        self.inner, self.backbone, self.truth = heads, backbone, truth
        self.row = 0

    max_horizontal = property(lambda self: self.inner.max_horizontal)
    max_vertical = property(lambda self: self.inner.max_vertical)

    def check_compatible(self, backbone):
        self.inner.check_compatible(backbone)

    def draft_below(self, hidden, embeds, rows):
        cols = self.backbone.grid.cols
        self.row += 1
        codes = self.truth[self.row * cols : (self.row + rows) * cols].view(rows, cols)
        # A hidden state whose final-norm + head argmax is the wanted code: that code's output-head row.
        start = self.backbone.tokens.code_offset
        rows_of_head = self.backbone.model.lm_head.weight[start + codes]  # [rows, C, d]
        return rows_of_head.expand(hidden.shape[0], -1, -1, -1) * 50
