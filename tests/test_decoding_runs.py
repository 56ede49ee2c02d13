"""Pass counts, the KV cache after rollbacks, row callbacks and bad input of the strategies."""

import math

import pytest
import torch

from ssd_pipelines import ARDecoding, ExactDecoding, SamplingConfig, SSDDecoding, make_strategy
from ssd_pipelines.decoding.block import Block
from ssd_pipelines.testing import tiny_backbone, tiny_heads

ROWS, COLS = 5, 7


@pytest.fixture
def grid_backbone():
    return tiny_backbone(rows=ROWS, cols=COLS, codebook_size=8)


def decode(strategy, backbone, seed=0, guidance=2.0, images=3, callback=None):
    sampling = SamplingConfig(guidance_scale=guidance)
    prompts = backbone.encode_prompts(
        ["a red circle", "blue"], num_images_per_prompt=images, guidance=sampling.uses_guidance
    )
    return strategy.decode(
        backbone, prompts, sampling, generator=torch.Generator().manual_seed(seed), callback=callback
    )


def test_ar_costs_one_pass_per_code(grid_backbone):
    stats = decode(ARDecoding(), grid_backbone).stats
    assert stats.forward_passes == ROWS * COLS
    assert stats.positions_processed == ROWS * (COLS + 1) - 2  # all but the last code and its end-of-line


def test_exact_processes_its_window_every_pass(grid_backbone):
    stats = decode(ExactDecoding(tiny_heads(grid_backbone), window=5), grid_backbone).stats
    assert stats.positions_processed == 5 * (stats.forward_passes - 1)  # the prefill runs the prompt only


@pytest.mark.parametrize("rounds", [0, 1, 2])
@pytest.mark.parametrize("vertical_rows", [1, 2])
def test_ssd_passes_follow_the_formula(grid_backbone, rounds, vertical_rows):
    """(r + 1) passes per block; the prefill stands in for the last block's commit, which nothing reads.
    The first row's last block is one exact cell: its first round rejects nothing, so it is also its commit."""
    heads = tiny_heads(grid_backbone)
    assert COLS == 1 + 5 + 1  # k_h = 5: a block of a first cell and five drafted cells, then a block of one cell
    later_blocks = math.ceil((ROWS - 1) / vertical_rows)
    out = decode(SSDDecoding(heads, verify_rounds=rounds, vertical_rows=vertical_rows), grid_backbone)
    assert out.stats.forward_passes == (1 + later_blocks) * (rounds + 1) + 1
    assert len(out.stats.drafted_per_round) == rounds
    assert out.codes.shape == (6, ROWS, COLS)


@pytest.mark.parametrize("rounds", [0, 1, 3])
@pytest.mark.parametrize("window", [4, 8, 16])
def test_pipelined_ssd_verifies_each_cell_at_most_r_times(grid_backbone, rounds, window):
    """On the sliding window a cell is kept as it is after its r-th verification: no cell is checked, or
    resampled, more often, and with r = 0 every pass commits its whole window unverified."""
    out = decode(SSDDecoding(tiny_heads(grid_backbone), verify_rounds=rounds, window=window), grid_backbone)
    assert len(out.stats.drafted_per_round) <= rounds
    assert int(out.final_round.max()) <= rounds + 1  # resampled in check k shows k + 1
    assert (out.codes >= 0).all() and out.stats.rows_completed == ROWS
    assert out.stats.positions_processed == window * (out.stats.forward_passes - 1)
    if rounds == 0:  # as `exact` with perfect drafts, each pass commits W of the S positions after the prefill;
        # one more pass where the window reaches a first-row cell past the horizontal heads' 5, sampled fresh
        passes = math.ceil(grid_backbone.grid.sequence_length / window)
        assert out.stats.forward_passes - 1 == passes + (window > 5)


def test_pipelined_ssd_with_no_cap_is_exact_draw_for_draw(grid_backbone):
    heads = tiny_heads(grid_backbone)
    ssd = decode(SSDDecoding(heads, verify_rounds=None, window=5), grid_backbone)
    exact = decode(ExactDecoding(heads, window=5), grid_backbone)
    assert torch.equal(ssd.codes, exact.codes) and ssd.stats.forward_passes == exact.stats.forward_passes


def test_rounds_stop_once_every_image_has_converged(grid_backbone):
    """A cap of 100 rounds runs no round after the one that rejected nothing, and reports none."""
    heads = tiny_heads(grid_backbone)
    capped = decode(SSDDecoding(heads, verify_rounds=100), grid_backbone, images=1)
    exact = decode(SSDDecoding(heads, verify_rounds=None), grid_backbone, images=1)
    assert capped.stats.forward_passes == exact.stats.forward_passes < ROWS * COLS
    assert torch.equal(capped.codes, exact.codes)  # the same decoding, draw for draw
    assert 1 < len(capped.stats.drafted_per_round) < COLS + 1
    assert all(d > 0 for d in capped.stats.drafted_per_round)


def test_greedy_rounds_stop_as_soon_as_a_round_rejects_nothing(grid_backbone):
    heads = tiny_heads(grid_backbone)
    sampling = SamplingConfig(temperature=0)
    prompts = grid_backbone.encode_prompts(["a"])
    out = SSDDecoding(heads, verify_rounds=50).decode(grid_backbone, prompts, sampling)
    assert out.stats.accepted_per_round[-1] == out.stats.drafted_per_round[-1]
    assert out.stats.forward_passes < ROWS * COLS + 2 * 5  # far from 50 rounds a block


@pytest.mark.parametrize("strategy", ["ssd", "exact"])
def test_cache_after_rollbacks_equals_a_fresh_forward(grid_backbone, strategy):
    """Every verification round is rolled back; what stays must be exactly the committed sequence."""
    heads = tiny_heads(grid_backbone)
    states = []
    prefill = grid_backbone.prefill
    grid_backbone.prefill = lambda prompts: states.append(prefill(prompts)) or states[-1]
    decoder = SSDDecoding(heads, verify_rounds=2) if strategy == "ssd" else ExactDecoding(heads)
    out = decode(decoder, grid_backbone, guidance=1.0, images=2)
    state, _ = states[0]
    assert out.stats.drafted_per_round[0] > out.stats.accepted_per_round[0]  # there were rejections to roll back

    codes = out.codes.flatten(1)
    fresh, _ = prefill(grid_backbone.encode_prompts(["a red circle", "blue"], num_images_per_prompt=2))
    block = Block(grid_backbone.grid, 0, ROWS * COLS)
    grid_backbone.extend(fresh, block.embed(grid_backbone, codes))
    committed = state.length - state.prompt_width
    last_block = (ROWS - 1) * grid_backbone.grid.row_length  # all rows but the last block's
    assert committed in (last_block, grid_backbone.grid.sequence_length)
    for ours, theirs in zip(state.cache.layers, fresh.cache.layers):
        assert ours.keys.shape[-2] == state.length
        torch.testing.assert_close(ours.keys, theirs.keys[..., : state.length, :], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours.values, theirs.values[..., : state.length, :], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("strategy", ["ar", "ssd", "exact"])
def test_callback_sees_each_row_once_in_order_and_can_stop(grid_backbone, strategy):
    heads = tiny_heads(grid_backbone)
    seen = []

    def on_row(row, codes):
        seen.append((row, codes[:, row].clone()))
        return row == 2  # stop after the third row

    out = decode(make_strategy(strategy, heads), grid_backbone, callback=on_row, images=1)
    assert [row for row, _ in seen] == [0, 1, 2]
    assert out.stats.rows_completed == 3
    for row, codes in seen:
        assert torch.equal(codes, out.codes[:, row])


def test_every_row_is_reported_when_nobody_stops(grid_backbone):
    rows = []
    decode(SSDDecoding(tiny_heads(grid_backbone), vertical_rows=2), grid_backbone, callback=lambda r, c: rows.append(r))
    assert rows == list(range(ROWS))


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda heads: SSDDecoding(heads, verify_rounds=-1),
            "`verify_rounds` must be an integer >= 0 for decoding='ssd'",
        ),
        (lambda heads: SSDDecoding(heads, vertical_rows=3), r"vertical_rows must be in 1..2"),
        (lambda heads: SSDDecoding(heads, horizontal_cells=6), r"horizontal_cells must be in 0..5"),
        (
            lambda heads: SSDDecoding(heads, window=0),
            r"`window` must be an integer >= 1 for decoding='ssd' \(.*\), got 0",
        ),
        (lambda heads: SSDDecoding(heads, vertical_rows=2, window=8), "pass vertical_rows=1, not 2, or window=None"),
        (lambda heads: make_strategy("medusa", heads), "unknown decoding 'medusa': choose one of ar, ssd, exact"),
        (lambda heads: make_strategy("ssd"), "pass heads=..., or use decoding='ar'"),
    ],
)
def test_bad_strategy_settings_say_what_to_change(heads, build, message):
    with pytest.raises(ValueError, match=message):
        build(heads)


def test_heads_for_another_backbone_are_refused_before_decoding(grid_backbone):
    other = tiny_heads(tiny_backbone(rows=ROWS, cols=COLS, codebook_size=8, hidden_size=16))
    with pytest.raises(ValueError, match=r"\(16, 16, 8\), the backbone has \(32, 32, 8\)"):
        decode(SSDDecoding(other), grid_backbone)


def test_guidance_and_prompt_batch_must_agree(grid_backbone):
    prompts = grid_backbone.encode_prompts(["a"])
    with pytest.raises(ValueError, match="encode the prompts with guidance=True"):
        ARDecoding().decode(grid_backbone, prompts, SamplingConfig(guidance_scale=2.0))


def test_ar_records_the_states_that_predicted_each_cell(grid_backbone):
    """What head distillation trains on: h(y, x) re-derived from a fresh pass over the final grid."""
    sampling = SamplingConfig(guidance_scale=2.0)
    prompts = grid_backbone.encode_prompts(["a red circle", "blue"], guidance=True)
    out = ARDecoding(record_hidden=True).decode(
        grid_backbone, prompts, sampling, generator=torch.Generator().manual_seed(0)
    )
    assert out.hidden.shape == (4, ROWS, COLS, 32)
    state, h_first = grid_backbone.prefill(prompts)
    block = Block(grid_backbone.grid, 0, ROWS * COLS)
    codes = out.codes.flatten(1).repeat(2, 1)
    expected = block.predicting_hidden(h_first, grid_backbone.extend(state, block.embed(grid_backbone, codes)))
    torch.testing.assert_close(out.hidden.flatten(1, 2), expected, atol=1e-4, rtol=1e-4)
    assert ARDecoding().decode(grid_backbone, prompts, sampling).hidden is None


def test_final_round_counts_what_each_round_accepted(grid_backbone):
    """With one round, a drafted cell either kept the head's code (1, counted as accepted) or was resampled (2)."""
    heads = tiny_heads(grid_backbone)
    out = decode(SSDDecoding(heads, verify_rounds=1), grid_backbone)
    final, stats = out.final_round, out.stats
    blocks = 2 + (ROWS - 1)  # two first-row blocks, then one block per row
    assert int((final == 0).sum()) == blocks * stats.images  # each block's first cell is exact
    assert int((final == 1).sum()) == stats.accepted_per_round[0]
    assert int((final == 2).sum()) == stats.drafted_per_round[0] - stats.accepted_per_round[0] > 0
    assert int((final > 2).sum()) == 0


def test_final_round_of_exact_and_ar(grid_backbone):
    heads = tiny_heads(grid_backbone)
    exact = decode(ExactDecoding(heads), grid_backbone)
    rejected = [d - a for d, a in zip(exact.stats.drafted_per_round, exact.stats.accepted_per_round)]
    for k, rejections in enumerate(rejected, start=1):  # a cell resampled in its k-th check, and kept since: k + 1
        assert int((exact.final_round == k + 1).sum()) <= rejections
    assert 2 < int(exact.final_round.max()) <= len(rejected) + 1
    assert int((exact.final_round == 0).sum()) >= exact.stats.images  # at least each image's first cell
    assert (decode(ARDecoding(), grid_backbone).final_round == 0).all()
