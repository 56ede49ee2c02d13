"""`exact` samples the AR distribution; `ssd` approaches it as rounds grow; wrong verifiers are caught.

On enumerable grids (2 x 3 cells of 3 codes: 729 images) the exact AR
probability of every image is known. Each check draws 30,000 images in one batch
and runs a likelihood-ratio (G) test against those probabilities; under exactness
G exceeds its bound once in 300,000 runs, and the wrong rules below land several
times above it.
"""

import pytest
import torch

import ssd_pipelines.decoding.frontier as frontier_module
import ssd_pipelines.decoding.ssd as ssd_module
from ssd_pipelines import ARDecoding, AutoDecoding, ExactDecoding, SamplingConfig, SSDDecoding
from ssd_pipelines.sampling import residual, sample_with, verify_with
from ssd_pipelines.testing import tiny_heads
from ssd_pipelines.testing.exactness import TOY_PROMPT, g_test, grid_index, grid_probabilities, measure, toy_setup
from ssd_pipelines.training.teacher_forcing import draft_below_teacher_forced

SAMPLES = 30_000
GUIDED = SamplingConfig(temperature=1.0, guidance_scale=2.0)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def g_of(strategy, setup=None, sampling=GUIDED, seed=0):
    backbone, heads = setup or toy_setup()
    probs = grid_probabilities(backbone, TOY_PROMPT, sampling)
    return measure(strategy(heads), backbone, sampling, SAMPLES, seed, probs).g


def test_the_toy_distribution_is_a_hard_one():
    backbone, _ = toy_setup()
    probs = grid_probabilities(backbone, TOY_PROMPT, GUIDED)
    assert abs(float(probs.sum()) - 1) < 1e-5
    entropy_bits = -(probs * probs.clamp_min(1e-30).log2()).sum()
    assert probs.max() < 0.3 and entropy_bits > 3.5  # many likely images, none dominant


def test_ar_passes_the_test():
    g = g_of(lambda heads: ARDecoding(), seed=1)
    assert g.passes, g


@pytest.mark.parametrize("window", [1, 2, 4, 8])
def test_exact_is_exact_for_any_window(window):
    """Windows from one cell to the whole image (2 rows of 3 cells + end-of-line = 8 positions)."""
    g = g_of(lambda heads: ExactDecoding(heads, window=window), seed=window)
    assert g.passes, g


@pytest.mark.parametrize(
    "setup, sampling",
    [
        pytest.param({"eol": False}, GUIDED, id="no-end-of-line"),
        pytest.param({"horizontal": 2}, GUIDED, id="k_h=2"),
        pytest.param({"rows": 3, "cols": 2}, GUIDED, id="3-rows"),
        pytest.param({}, SamplingConfig(temperature=1.0, guidance_scale=2.0, top_k=2), id="top-k"),
        pytest.param({}, SamplingConfig(temperature=0.8, top_p=0.7), id="top-p-unguided"),
    ],
)
def test_exact_is_exact_across_grids_and_sampling(setup, sampling):
    g = g_of(lambda heads: ExactDecoding(heads, window=3), toy_setup(**setup), sampling, seed=11)
    assert g.passes, g


@pytest.mark.parametrize("vertical_rows", [1, 2])
def test_ssd_with_no_cap_on_rounds_is_exact(vertical_rows):
    g = g_of(lambda heads: SSDDecoding(heads, verify_rounds=None, vertical_rows=vertical_rows), seed=21)
    assert g.passes, g


@pytest.mark.parametrize("window", [2, 8])
def test_pipelined_ssd_with_no_cap_is_exact(window):
    g = g_of(lambda heads: SSDDecoding(heads, verify_rounds=None, window=window), seed=50 + window)
    assert g.passes, g


def test_pipelined_ssd_converges_with_rounds():
    """On the sliding window the cap counts each cell's own checks, some made before its left context was
    final: the error still falls with r, and a generous cap is exact."""
    tests = [g_of(lambda heads, r=r: SSDDecoding(heads, verify_rounds=r, window=4), seed=60 + r) for r in (0, 1, 6)]
    assert tests[0].statistic > tests[1].statistic > tests[1].bound and tests[2].passes, tests


def test_ssd_converges_with_rounds():
    """Blocks here hold 3 cells: the first is exact, each round fixes one more, so r = 2 is already exact."""
    tests = [g_of(lambda heads, r=r: SSDDecoding(heads, verify_rounds=r), seed=30 + r) for r in range(3)]
    assert tests[0].statistic > tests[1].statistic > tests[1].bound and tests[2].passes, tests


def row_setup(drafter, **grid):
    """The toy backbone with "row", "inrow" or "recurrent" heads (kernel 3, so that the row's ends are padded). An
    in-row drafter's W_left is scaled up, so that its drafts depend strongly on the codes drawn to their left."""
    backbone, _ = toy_setup(**grid)
    heads = tiny_heads(backbone, horizontal=(1, 2, 3, 4, 5), drafter=drafter, row_kernel=3)
    if drafter in ("inrow", "recurrent"):
        with torch.no_grad():
            heads.vertical[0].left.weight.mul_(8)
    return backbone, heads


@pytest.mark.parametrize("drafter", ["row", "inrow", "recurrent"])
@pytest.mark.parametrize(
    "strategy, grid",
    [
        pytest.param(lambda heads: ExactDecoding(heads, window=2), {}, id="exact-W=2"),
        pytest.param(lambda heads: ExactDecoding(heads, window=8), {}, id="exact-W=8"),
        pytest.param(lambda heads: ExactDecoding(heads, window=3), {"rows": 3, "cols": 2}, id="exact-3-rows"),
        pytest.param(lambda heads: SSDDecoding(heads, verify_rounds=None), {}, id="ssd-no-cap"),
        pytest.param(lambda heads: SSDDecoding(heads, verify_rounds=None, window=4), {}, id="pipelined-no-cap"),
    ],
)
def test_row_drafters_keep_exact_and_uncapped_ssd_exact(drafter, strategy, grid):
    g = g_of(strategy, row_setup(drafter, **grid), seed=70)
    assert g.passes, g


def test_ssd_with_an_inrow_drafter_converges_with_rounds():
    """The test sees the in-row drafts: with no verification (r = 0) they are far from AR, one round is closer."""
    tests = [
        g_of(lambda heads, r=r: SSDDecoding(heads, verify_rounds=r), row_setup("inrow"), seed=80 + r) for r in (0, 1, 2)
    ]
    assert tests[0].statistic > tests[1].statistic > tests[1].bound and tests[2].passes, tests


def test_an_inrow_q_that_is_not_the_one_drawn_from_is_caught(monkeypatch):
    """Codes drawn left to right from the codes to their left, but each q taken as if those were off the row."""
    right = SSDDecoding._draft_below

    def wrong(self, run, block, h_next, row_hidden, row_embeds, noise):
        codes, q = right(self, run, block, h_next, row_hidden, row_embeds, noise)
        blind = draft_below_teacher_forced(self.heads, row_hidden, row_embeds, torch.zeros_like(row_embeds))
        return codes, torch.cat([q[:, :1], run.probs(blind.to(h_next.dtype))[:, 1:]], dim=1)

    monkeypatch.setattr(SSDDecoding, "_draft_below", wrong)
    g = g_of(lambda heads: SSDDecoding(heads, verify_rounds=None), row_setup("inrow"), seed=90)
    assert g.statistic > 3 * g.bound, g


def _keep_head_q(tokens, q, p, accept_noise, residual_noise):
    """The rule SJD uses: the next q is the distribution each token was drawn from."""
    new_tokens, _, accepted = verify_with(tokens, q, p, accept_noise, residual_noise)
    return new_tokens, torch.where(accepted.unsqueeze(-1), q, residual(p, q)), accepted


def _skip_residual(tokens, q, p, accept_noise, residual_noise):
    p_token = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    q_token = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    accepted = accept_noise * q_token < p_token
    return torch.where(accepted, tokens, sample_with(p, residual_noise)), p, accepted


def test_a_wrong_frontier_rule_is_caught(monkeypatch):
    """Also committing the cell after the first change, whose p was computed from a stale left context."""
    right = frontier_module.committed_positions
    monkeypatch.setattr(
        frontier_module, "committed_positions", lambda changed: (right(changed) + 1).clamp_max(changed.shape[1] - 1)
    )
    g = g_of(lambda heads: ExactDecoding(heads, window=4), seed=41)
    assert g.statistic > 3 * g.bound, g


@pytest.mark.parametrize("module", [frontier_module, ssd_module], ids=["exact", "ssd-no-cap"])
@pytest.mark.parametrize("wrong_round", [_keep_head_q, _skip_residual])
def test_a_wrong_verifier_is_caught(monkeypatch, module, wrong_round):
    monkeypatch.setattr(module, "verify_with", wrong_round)
    build = (
        (lambda h: ExactDecoding(h, window=8))
        if module is frontier_module
        else (lambda h: SSDDecoding(h, verify_rounds=None))
    )
    g = g_of(build, seed=51)
    assert g.statistic > 3 * g.bound, g


PER_IMAGE_SAMPLES = 10_000  # one torch.Generator per image draws image by image: fewer images, the same test


def g_with_generators(strategy, seed, samples=PER_IMAGE_SAMPLES, setup=None, sampling=GUIDED):
    """The G test of images drawn in one batch, each from its own generator (seeded seed * samples + i)."""
    backbone, heads = setup or toy_setup()
    probs = grid_probabilities(backbone, TOY_PROMPT, sampling)
    prompts = backbone.encode_prompts([TOY_PROMPT], num_images_per_prompt=samples, guidance=sampling.uses_guidance)
    generators = [torch.Generator().manual_seed(seed * samples + i) for i in range(samples)]
    out = strategy(heads).decode(backbone, prompts, sampling, generator=generators)
    counts = torch.bincount(grid_index(out.codes, backbone.grid.codebook_size), minlength=len(probs))
    return g_test(counts, probs), out.stats


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param(lambda heads: ARDecoding(), id="ar"),
        pytest.param(lambda heads: ExactDecoding(heads, window=3), id="exact-W=3"),
        pytest.param(lambda heads: SSDDecoding(heads, verify_rounds=None), id="ssd-no-cap"),
    ],
)
def test_one_generator_per_image_still_samples_the_ar_distribution(strategy):
    """Each image drawing from its own generator (a converged `ssd` image drawing nothing more) changes which
    sample each image gets, not the distribution."""
    g, _ = g_with_generators(strategy, seed=95)
    assert g.passes, g


@pytest.mark.parametrize("exact_max_batch, chosen", [(SAMPLES, "exact"), (SAMPLES - 1, "ar")])
def test_auto_samples_the_ar_distribution_on_both_sides_of_its_crossover(exact_max_batch, chosen):
    backbone, heads = toy_setup()
    probs = grid_probabilities(backbone, TOY_PROMPT, GUIDED)
    prompts = backbone.encode_prompts([TOY_PROMPT], num_images_per_prompt=SAMPLES, guidance=True)
    strategy = AutoDecoding(heads, exact_max_batch=exact_max_batch, window=3)
    out = strategy.decode(backbone, prompts, GUIDED, generator=torch.Generator().manual_seed(97))
    counts = torch.bincount(grid_index(out.codes, backbone.grid.codebook_size), minlength=len(probs))
    g = g_test(counts, probs)
    assert out.stats.strategy == "auto" and out.stats.chosen_decoding == chosen
    assert g.passes, g


def test_auto_with_one_generator_per_image_samples_the_ar_distribution():
    g, stats = g_with_generators(lambda heads: AutoDecoding(heads, exact_max_batch=PER_IMAGE_SAMPLES), seed=98)
    assert stats.chosen_decoding == "exact" and g.passes, g


def test_a_reproposed_q_that_the_code_was_not_drawn_from_is_caught(monkeypatch):
    """`exact`'s re-proposals with q moved to q' but the code kept as it was (no accept/resample step against q')."""
    right = frontier_module.FrontierRun._repropose

    def wrong(self, cells, codes, todo, new_codes, next_q, accept_noise, residual_noise):
        _, moved_q, moved = right(self, cells, codes, todo, new_codes, next_q, accept_noise, residual_noise)
        return new_codes, moved_q, torch.zeros_like(moved)

    monkeypatch.setattr(frontier_module.FrontierRun, "_repropose", wrong)
    g = g_of(lambda heads: ExactDecoding(heads, window=8), row_setup("inrow"), seed=100)
    assert g.statistic > 3 * g.bound, g
