"""The published peers as strategies: the lossless ones sample the AR distribution, greedy SJD is greedy AR,
and with perfect drafts every method takes the passes its formula says.

Distribution checks draw 30,000 images of an enumerable grid (2 x 3 cells of 3 codes, 729 images) and run the
likelihood-ratio (G) test of `test_decoding_distribution.py` against the enumerated AR probabilities.
"""

import math

import pytest
import torch

import ssd_pipelines.peers.candidate_tree as tree_module
from ssd_pipelines import ARDecoding, SamplingConfig
from ssd_pipelines.decoding import (
    ExactDecoding,
    GSDDecoding,
    MTP1DDecoding,
    SJDDecoding,
    SJDPACDecoding,
    SSDDecoding,
    ZipARDecoding,
)
from ssd_pipelines.testing import flat_backbone, tiny_backbone, tiny_heads, with_uniform_drafts
from ssd_pipelines.testing.exactness import TOY_PROMPT, grid_probabilities, measure, toy_setup

SAMPLES = 30_000
GUIDED = SamplingConfig(temperature=1.0, guidance_scale=2.0)
PROMPTS = ["a red circle", "blue square"]  # different lengths: the batch is left-padded


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def g_of(build, setup=None, seed=0):
    backbone, heads = setup or toy_setup()
    probs = grid_probabilities(backbone, TOY_PROMPT, GUIDED)
    return measure(build(heads), backbone, GUIDED, SAMPLES, seed, probs)


@pytest.mark.parametrize(
    "build, setup",
    [
        pytest.param(lambda heads: SJDDecoding(window=3), {}, id="sjd"),
        pytest.param(lambda heads: SJDPACDecoding(window=9, tree_width=2, tree_depth=3), {}, id="sjd-pac"),
        pytest.param(lambda heads: MTP1DDecoding(heads, horizontal_cells=2), {}, id="mtp1d"),
        pytest.param(lambda heads: ZipARDecoding(window=3), {"eol": False}, id="zipar-w=C"),
    ],
)
def test_lossless_peers_sample_the_ar_distribution(build, setup):
    row = g_of(build, toy_setup(**setup), seed=61)
    assert row.g.passes, row.g


def test_grouped_acceptance_gives_up_the_ar_distribution():
    row = g_of(lambda heads: GSDDecoding(window=3), seed=62)
    assert not row.g.passes, row.g


def test_a_wrong_recursive_check_is_caught(monkeypatch):
    """Judging each further candidate against p itself rather than the residual its rejected siblings left."""
    monkeypatch.setattr(tree_module, "residual", lambda p, q: p)
    row = g_of(lambda heads: SJDPACDecoding(window=7, tree_width=3, tree_depth=2), toy_setup(eol=False), seed=64)
    assert row.g.statistic > 3 * row.g.bound, row.g


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda heads: SJDDecoding(), id="sjd"),
        pytest.param(lambda heads: SJDDecoding(window=5), id="sjd-W=5"),
        pytest.param(lambda heads: SJDPACDecoding(window=24), id="sjd-pac"),
        pytest.param(lambda heads: MTP1DDecoding(heads), id="mtp1d"),
    ],
)
@pytest.mark.parametrize("eol", [True, False], ids=["eol", "no-eol"])
def test_lossless_peers_in_greedy_mode_return_the_ar_grid(build, eol):
    backbone = tiny_backbone(rows=5, cols=7, codebook_size=8, eol=eol)
    sampling = SamplingConfig(temperature=0, guidance_scale=3.0)
    prompts = backbone.encode_prompts(PROMPTS, num_images_per_prompt=2, guidance=True)
    ar = ARDecoding().decode(backbone, prompts, sampling)
    ours = build(tiny_heads(backbone)).decode(backbone, prompts, sampling, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ours.codes, ar.codes)
    assert len(set(ar.codes.flatten().tolist())) > 2  # the grid is not trivially constant
    assert ours.stats.forward_passes < ar.stats.forward_passes
    assert ours.stats.rows_completed == 5


ROWS, COLS = 3, 5


def window_passes(positions: int, window: int) -> int:
    """A window of W positions per pass, every draft accepted: the prefill, then W positions a pass."""
    return 1 + math.ceil(positions / min(window, positions))


@pytest.mark.parametrize("eol", [True, False], ids=["eol", "no-eol"])
@pytest.mark.parametrize(
    "build, formula",
    [
        pytest.param(lambda h: with_uniform_drafts(SJDDecoding)(4), lambda S, L: window_passes(S, 4), id="sjd"),
        pytest.param(lambda h: with_uniform_drafts(GSDDecoding)(4), lambda S, L: window_passes(S, 4), id="gsd"),
        # sjd-pac: 9 tokens a pass, of which 1 side node of the tree (width 2, depth 2): 8 chain positions
        pytest.param(lambda h: SJDPACDecoding(9, 2, 2), lambda S, L: window_passes(S, 8), id="sjd-pac"),
        pytest.param(lambda h: SJDPACDecoding(20, 2, 3), lambda S, L: window_passes(S, 16), id="sjd-pac-D=3"),
        # mtp1d: k_h drafts and a bonus a pass, never across a row end: ceil((C + eol) / (k_h + 1)) passes a row
        pytest.param(lambda h: MTP1DDecoding(h, 2), lambda S, L: 1 + ROWS * math.ceil(L / 3), id="mtp1d-k=2"),
        pytest.param(lambda h: MTP1DDecoding(h, 5), lambda S, L: 1 + ROWS * math.ceil(L / 6), id="mtp1d-k=5"),
        pytest.param(lambda h: ZipARDecoding(2), lambda S, L: (ROWS - 1) * 2 + COLS, id="zipar"),
        pytest.param(lambda h: ExactDecoding(h, window=3), lambda S, L: window_passes(S, 3), id="exact"),
        pytest.param(lambda h: SSDDecoding(h, 1), lambda S, L: 1 + math.ceil(COLS / 6) + ROWS - 1, id="ssd"),
        pytest.param(lambda h: ARDecoding(), lambda S, L: ROWS * COLS, id="ar"),
    ],
)
def test_with_perfect_drafts_passes_follow_each_formula(build, formula, eol):
    """On a backbone whose conditionals are uniform, drafts with a uniform q are never rejected."""
    backbone = flat_backbone(rows=ROWS, cols=COLS, codebook_size=8, eol=eol)
    prompts = backbone.encode_prompts(PROMPTS, guidance=True)
    out = build(tiny_heads(backbone)).decode(backbone, prompts, GUIDED, generator=torch.Generator().manual_seed(0))
    row_length = COLS + int(eol)
    assert out.stats.forward_passes == formula(ROWS * row_length, row_length)
    drafted = sum(out.stats.drafted_per_round)
    assert sum(out.stats.accepted_per_round) == drafted


def test_zipar_passes_do_not_depend_on_the_drafts():
    backbone = tiny_backbone(rows=4, cols=6, codebook_size=8)
    out = ZipARDecoding().decode(backbone, backbone.encode_prompts(PROMPTS, guidance=True), GUIDED)
    assert out.stats.forward_passes == 3 * 2 + 6  # w = a third of a row
    assert (out.codes >= 0).all() and out.stats.rows_completed == 4


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: SJDDecoding(window=1), "window must be an integer >= 2"),
        (lambda: SJDPACDecoding(window=12, tree_width=3, tree_depth=3), "needs at least 5"),
        (lambda: GSDDecoding(neighbour_quantile=0), r"neighbour_quantile must lie in \(0, 1\]"),
        (lambda: ZipARDecoding(window=0), "window must be a positive number of cells"),
    ],
)
def test_bad_peer_settings_say_what_to_change(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    "build, width",
    [
        (lambda heads: SJDDecoding(window=8), 8),
        (lambda heads: GSDDecoding(window=8), 8),
        (lambda heads: SJDPACDecoding(window=16, tree_width=2, tree_depth=2), 16),  # the tree's nodes included
        (lambda heads: MTP1DDecoding(heads), None),
        (lambda heads: ZipARDecoding(window=1), None),
    ],
    ids=["sjd", "gsd", "sjd-pac", "mtp1d", "zipar"],
)
def test_every_peer_counts_the_positions_its_passes_carry(build, width):
    backbone = tiny_backbone(rows=4, cols=4, codebook_size=8)  # 20 positions: wider than each window
    prompts = backbone.encode_prompts(PROMPTS, guidance=True)
    out = build(tiny_heads(backbone)).decode(backbone, prompts, GUIDED, generator=torch.Generator().manual_seed(0))
    passes, positions = out.stats.forward_passes - 1, out.stats.positions_processed  # the prefill carries none
    assert passes > 0 and positions >= passes
    if width is not None:  # a window's passes each carry the whole window
        assert positions == passes * width
