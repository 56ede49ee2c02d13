"""`exact` is lossless: in greedy mode it returns the AR grid token for token."""

import math

import pytest
import torch
import torch.nn.functional as F

import ssd_pipelines.decoding.exact as exact_module
from ssd_pipelines import ARDecoding, ExactDecoding, SamplingConfig, SSDDecoding
from ssd_pipelines.testing import tiny_backbone, tiny_heads

PROMPTS = ["a red circle", "blue square"]  # different lengths: the batch is left-padded


@pytest.mark.parametrize("eol", [True, False], ids=["eol", "no-eol"])
@pytest.mark.parametrize("guidance", [1.0, 3.0], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize("window", [1, 3, 8, 40], ids=lambda w: f"W={w}")
def test_exact_greedy_equals_ar_greedy(eol, guidance, window):
    backbone = tiny_backbone(rows=5, cols=7, codebook_size=8, eol=eol)
    heads = tiny_heads(backbone)
    sampling = SamplingConfig(temperature=0, guidance_scale=guidance)
    prompts = backbone.encode_prompts(PROMPTS, num_images_per_prompt=2, guidance=sampling.uses_guidance)
    ar = ARDecoding().decode(backbone, prompts, sampling)
    exact = ExactDecoding(heads, window=window).decode(backbone, prompts, sampling)
    assert exact.codes.shape == (4, 5, 7)
    assert torch.equal(exact.codes, ar.codes)
    assert len(set(ar.codes.flatten().tolist())) > 2  # the grid is not trivially constant
    assert exact.stats.rows_completed == ar.stats.rows_completed == 5


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eol", [True, False], ids=["eol", "no-eol"])
def test_exact_greedy_in_bf16_equals_ar_up_to_rounding(seed, eol):
    """A block pass and a one-token pass round differently in bf16, so near-tied argmaxes may swap
    (docs/decoding.md, "In floating point"); after a swap the two images continue from different prefixes. So
    wherever an image first differs from AR's, exact's code there is a near-tie of AR's own guided logits: within
    what rounding moves them. We allow one bf16 unit in the last place (ulp) of error in each branch's logit of each
    of the two codes; guidance s weighs the branches by s and |1 - s|, so the gap may move by 2 (s + |1 - s|) ulp,
    10 ulp at s = 3: 0.31 for logits in [4, 8), still well under the gaps between unrelated codes.
    How many swaps happen depends on the CPU's bf16 kernels; in float32 the images are identical."""
    backbone = tiny_backbone(rows=5, cols=7, codebook_size=8, eol=eol, seed=seed)
    heads = tiny_heads(backbone)
    backbone.model.to(torch.bfloat16)
    heads.to(torch.bfloat16)
    sampling = SamplingConfig(temperature=0, guidance_scale=3.0)
    prompts = backbone.encode_prompts(PROMPTS, num_images_per_prompt=2, guidance=True)
    ar = ARDecoding(record_hidden=True).decode(backbone, prompts, sampling)
    exact = ExactDecoding(heads).decode(backbone, prompts, sampling)
    images = ar.codes.shape[0]
    ar_codes, exact_codes = ar.codes.flatten(1), exact.codes.flatten(1)
    hidden = ar.hidden.flatten(1, 2)  # [B', cells, d]: AR's state predicting each cell
    for image in range(images):
        differs = (exact_codes[image] != ar_codes[image]).nonzero()
        if len(differs) == 0:
            continue
        cell = int(differs[0])
        cond, uncond = backbone.code_logits(hidden[[image, images + image], cell]).float()
        scale = sampling.guidance_scale
        guided = uncond + scale * (cond - uncond)
        ulp = torch.finfo(torch.bfloat16).eps * 2 ** torch.floor(torch.log2(torch.stack([cond, uncond]).abs().max()))
        rounding = 2 * (scale + abs(1 - scale)) * ulp
        assert guided.max() - guided[exact_codes[image, cell]] <= rounding, (image, cell, guided, rounding)


@pytest.mark.parametrize(
    "options", [{"vertical_rows": 1}, {"vertical_rows": 2}, {"window": 8}], ids=["k_v=1", "k_v=2", "pipelined"]
)
def test_ssd_with_no_cap_on_rounds_greedy_equals_ar_greedy(options):
    backbone = tiny_backbone(rows=5, cols=7, codebook_size=8)
    sampling = SamplingConfig(temperature=0, guidance_scale=3.0)
    prompts = backbone.encode_prompts(PROMPTS, num_images_per_prompt=2, guidance=True)
    ar = ARDecoding().decode(backbone, prompts, sampling)
    ssd = SSDDecoding(tiny_heads(backbone), verify_rounds=None, **options)
    assert torch.equal(ssd.decode(backbone, prompts, sampling).codes, ar.codes)


@pytest.mark.parametrize("window", [3, 6, 12])
def test_exact_with_perfect_drafts_commits_a_whole_window_per_pass(monkeypatch, window):
    """Drafts that are the greedy AR codes are always accepted: each pass commits its W positions and makes
    the one past them final, so a sequence of S positions takes ceil(S / W) passes after the prefill."""
    backbone = tiny_backbone(rows=4, cols=5, codebook_size=8)  # 4 rows of 5 codes + end-of-line: S = 24
    sampling = SamplingConfig(temperature=0)
    prompts = backbone.encode_prompts(["a", "blue"])
    truth = ARDecoding().decode(backbone, prompts, sampling).codes.flatten(1)

    class PerfectDrafts(exact_module.FrontierRun):
        def _draft(self, progress, noise):
            undrafted = self.run.codes < 0
            super()._draft(progress, noise)
            b, c = (undrafted & (self.run.codes >= 0)).nonzero(as_tuple=True)
            self.run.codes[b, c] = truth[b, c]
            self.q[b, c % self.ring] = F.one_hot(truth[b, c], 8).float()

    monkeypatch.setattr(exact_module, "FrontierRun", PerfectDrafts)
    out = ExactDecoding(tiny_heads(backbone), window=window).decode(backbone, prompts, sampling)
    assert torch.equal(out.codes.flatten(1), truth)
    assert out.stats.forward_passes == 1 + math.ceil(24 / window)
    assert all(rate == 1.0 for rate in out.stats.acceptance_per_round)
