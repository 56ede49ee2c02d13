import json

import pytest
import torch
import torch.nn.functional as F

from ssd_pipelines import DraftHeads
from ssd_pipelines.testing import tiny_backbone, tiny_heads
from ssd_pipelines.training.teacher_forcing import draft_below_teacher_forced


def test_head_computes_w0z_plus_swiglu_of_rmsnorm(heads):
    head = heads.vertical[0]
    h, e = torch.randn(3, heads.config.hidden_size), torch.randn(3, heads.config.embed_size)
    x = torch.cat([h, e], -1) @ head.proj.weight.T
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * head.norm.weight
    expected = x + (F.silu(n @ head.gate.weight.T) * (n @ head.up.weight.T)) @ head.down.weight.T
    torch.testing.assert_close(head(h, e), expected)


def test_drafting_shapes(heads):
    h, e = torch.randn(2, 32), torch.randn(2, 32)
    assert heads.draft_right(h, e, 3).shape == (2, 3, 32)
    assert heads.draft_below(torch.randn(2, 5, 32), torch.randn(2, 5, 32), 2).shape == (2, 2, 5, 32)


def test_save_and_load_round_trip_as_safetensors(heads, tmp_path):
    heads.register_to_config(base_model="org/tiny-llama")
    heads.save_pretrained(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["config.json", "diffusion_pytorch_model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["hidden_size"] == 32 and config["embed_size"] == 32 and config["codebook_size"] == 8
    assert config["horizontal_offsets"] == [1, 2, 3, 4, 5] and config["vertical_offsets"] == [1, 2]
    assert config["base_model"] == "org/tiny-llama"
    loaded = DraftHeads.from_pretrained(tmp_path)
    h, e = torch.randn(4, 32), torch.randn(4, 32)
    torch.testing.assert_close(loaded.draft_right(h, e, 5), heads.draft_right(h, e, 5))


def test_heads_for_another_backbone_name_both_shapes():
    other = tiny_backbone(rows=4, cols=5, codebook_size=8, hidden_size=16)
    heads = tiny_heads(tiny_backbone(rows=4, cols=5, codebook_size=8))
    with pytest.raises(ValueError, match=r"heads expect .* = \(32, 32, 8\), the backbone has \(16, 16, 8\)"):
        heads.check_compatible(other)


def test_offsets_must_be_contiguous_from_one():
    with pytest.raises(ValueError, match="contiguous from 1"):
        DraftHeads(hidden_size=8, embed_size=8, codebook_size=4, horizontal_offsets=(1, 3))
    with pytest.raises(ValueError, match="at least one vertical offset"):
        DraftHeads(hidden_size=8, embed_size=8, codebook_size=4, vertical_offsets=())


# The row drafters: "row" (row context), "inrow" (row context + the codes drafted to the left) and "recurrent"
# ("inrow" + the state predicting the cell to the left).


def row_heads(drafter, seed=3, **kwargs):
    torch.manual_seed(seed)
    return DraftHeads(
        hidden_size=16,
        embed_size=12,
        codebook_size=8,
        horizontal_offsets=(1, 2),
        vertical_offsets=(1,),
        vertical_drafter=drafter,
        **kwargs,
    ).eval()


def randomise(heads, seed=4):
    """Random values in every parameter (the start vectors start at zero, which would hide them)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return heads


def left_codes_of(heads, row, x, left_codes=2):
    """What cell x of a drafted row reads of the codes to its left, x-1 first: row [n, C, d_e] -> [n, L, d_e], the
    start vectors where a cell falls off the row."""
    columns = torch.arange(x - 1, x - left_codes - 1, -1)
    return heads.start_embeds(row[:, columns.clamp_min(0)], (columns < 0).expand(row.shape[0], -1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"vertical_drafter": "rows"},
            r"vertical_drafter must be one of 'cell', 'row', 'inrow', 'recurrent'.*got 'rows'",
        ),
        ({"vertical_drafter": "row", "row_kernel": 4}, r"row_kernel must be an odd positive integer.*got 4"),
        ({"vertical_drafter": "row", "row_kernel": 0}, r"row_kernel must be an odd positive integer.*got 0"),
        ({"vertical_drafter": "inrow", "left_codes": 0}, r"left_codes must be a positive integer.*got 0"),
        ({"vertical_drafter": "inrow", "left_codes": 1.5}, r"left_codes must be a positive integer.*got 1.5"),
        ({"vertical_drafter": "inrow", "vertical_offsets": (1, 2)}, r"pass vertical_offsets=\(1,\), not \(1, 2\)"),
        ({"vertical_drafter": "row"}, r"pass vertical_offsets=\(1,\), not \(1, 2\)"),  # the default offsets
    ],
)
def test_bad_drafter_settings_say_what_to_pass(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DraftHeads(hidden_size=8, embed_size=8, codebook_size=4, **kwargs)


def test_the_per_cell_drafter_is_the_default_and_drafts_through_the_same_interface(heads):
    """The row context of per-cell heads is W0 z of the cell above, and a step refines it: the same drafts as
    draft_below, so that the engines drive every kind alike."""
    assert heads.config.vertical_drafter == "cell" and heads.drafter == "cell" and not heads.in_row
    assert heads.config.row_kernel == 5 and heads.config.left_codes == 2
    assert (heads.vertical.reach, heads.vertical.left_codes, heads.vertical.max_rows) == (0, 0, 2)
    hidden, embeds = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    stepped = heads.draft_step(heads.row_context(hidden, embeds))
    torch.testing.assert_close(stepped, heads.draft_below(hidden, embeds, 1)[:, 0])
    torch.testing.assert_close(
        heads.row_context_at(hidden[:, :, None], embeds[:, :, None]), heads.row_context(hidden, embeds)
    )
    with pytest.raises(ValueError, match="reads neither the codes nor the state to a cell's left"):
        heads.draft_step(torch.randn(2, 32), torch.randn(2, 2, 32))
    with pytest.raises(ValueError, match="start_embeds is for 'inrow'"):
        row_heads("row").start_embeds(torch.randn(2, 2, 12), torch.ones(2, 2, dtype=torch.bool))


def test_old_heads_folder_without_the_new_keys_loads_as_per_cell(heads, tmp_path):
    heads.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("vertical_drafter", "row_kernel", "left_codes"):
        del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = DraftHeads.from_pretrained(tmp_path)
    assert loaded.config.vertical_drafter == "cell" and loaded.max_vertical == 2
    h, e = torch.randn(3, 5, 32), torch.randn(3, 5, 32)
    torch.testing.assert_close(loaded.draft_below(h, e, 2), heads.draft_below(h, e, 2), rtol=0, atol=0)


@pytest.mark.parametrize("drafter", ["row", "inrow", "recurrent"])
def test_row_drafters_save_and_load_round_trip(drafter, tmp_path):
    heads = randomise(row_heads(drafter, row_kernel=3, left_codes=3))
    heads.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["vertical_drafter"], config["row_kernel"], config["left_codes"]) == (drafter, 3, 3)
    assert config["vertical_offsets"] == [1]
    loaded = DraftHeads.from_pretrained(tmp_path)
    assert loaded.drafter == drafter and loaded.config.row_kernel == 3 and loaded.config.left_codes == 3
    for name, tensor in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    hidden, embeds, row, state = (
        torch.randn(2, 7, 16),
        torch.randn(2, 7, 12),
        torch.randn(2, 7, 12),
        torch.randn(2, 7, 16),
    )
    assert torch.equal(
        draft_below_teacher_forced(loaded, hidden, embeds, row, state),
        draft_below_teacher_forced(heads, hidden, embeds, row, state),
    )


def test_the_row_drafter_is_a_conv_over_the_row_above_then_swiglu():
    heads = randomise(row_heads("row"))
    head = heads.vertical[0]
    hidden, embeds = torch.randn(2, 6, 16), torch.randn(2, 6, 12)
    z = F.pad(torch.cat([hidden, embeds], -1), (0, 0, 2, 2))  # zero padding at the row ends, kernel 5
    x = torch.stack([torch.einsum("bkd,hdk->bh", z[:, c : c + 5], head.conv.weight) for c in range(6)], dim=1)
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * head.norm.weight
    expected = x + (F.silu(n @ head.gate.weight.T) * (n @ head.up.weight.T)) @ head.down.weight.T
    drafted = heads.draft_below(hidden, embeds, 1)
    assert drafted.shape == (2, 1, 6, 16)  # the shape of draft_below with per-cell heads
    torch.testing.assert_close(drafted[:, 0], expected)
    torch.testing.assert_close(draft_below_teacher_forced(heads, hidden, embeds, torch.randn(2, 6, 12)), expected)
    context = heads.row_context(hidden, embeds)
    torch.testing.assert_close(torch.stack([heads.draft_step(context[:, c]) for c in range(6)], 1), expected)
    with pytest.raises(ValueError, match="reads no codes to a cell's left: pass left_embeds=None"):
        heads.draft_step(context[:, 0], torch.randn(2, 2, 12))
    with pytest.raises(ValueError, match="drafts rows 1..1 below the committed one: pass rows in that range, not 2"):
        heads.draft_below(hidden, embeds, 2)


@pytest.mark.parametrize("drafter", ["row", "inrow"])
def test_context_at_one_cell_is_the_row_context_there(drafter):
    heads = randomise(row_heads(drafter, row_kernel=3))
    hidden, embeds = torch.randn(2, 5, 16), torch.randn(2, 5, 12)
    context = heads.row_context(hidden, embeds)
    padded_h, padded_e = F.pad(hidden, (0, 0, 1, 1)), F.pad(embeds, (0, 0, 1, 1))
    for x in range(5):
        at = heads.row_context_at(padded_h[:, x : x + 3], padded_e[:, x : x + 3])
        torch.testing.assert_close(at, context[:, x])


@pytest.mark.parametrize("left_codes, cols", [(2, 6), (3, 2), (1, 4)])
def test_inrow_teacher_forced_equals_stepwise(left_codes, cols):
    """Cell x of the teacher-forced row is what draft_step gives from the true codes at x-1..x-L (start vectors
    where they fall off the row): the function the loss trains is the one decoding runs."""
    heads = randomise(row_heads("inrow", left_codes=left_codes))
    hidden, embeds, row = torch.randn(3, 2, cols, 16), torch.randn(3, 2, cols, 12), torch.randn(3, 2, cols, 12)
    forced = draft_below_teacher_forced(heads, hidden, embeds, row)  # any leading dims
    assert forced.shape == (3, 2, cols, 16)
    flat_h, flat_e, flat_row = hidden.flatten(0, 1), embeds.flatten(0, 1), row.flatten(0, 1)
    context = heads.row_context(flat_h, flat_e)
    for x in range(cols):
        stepped = heads.draft_step(context[:, x], left_codes_of(heads, flat_row, x, left_codes))
        torch.testing.assert_close(forced.flatten(0, 1)[:, x], stepped)
    # the start vectors are what a cell reads off the row: cell 0 reads none of the row's codes
    other = row.clone()
    other[..., 0, :] = torch.randn(3, 2, 12)
    changed = draft_below_teacher_forced(heads, hidden, embeds, other)
    torch.testing.assert_close(changed[..., 0, :], forced[..., 0, :], rtol=0, atol=0)
    assert not torch.allclose(changed[..., 1, :], forced[..., 1, :])


def test_inrow_draft_depends_on_the_code_to_its_left_with_set_weights():
    """A drafter that reads only the code at x - 1 (conv and the second left slot zeroed): changing that code
    changes the draft at x, through the backbone's own output head, to the distribution set for it."""
    backbone = tiny_backbone(rows=3, cols=4, codebook_size=8)
    heads = DraftHeads(
        hidden_size=32,
        embed_size=32,
        codebook_size=8,
        horizontal_offsets=(1,),
        vertical_offsets=(1,),
        vertical_drafter="inrow",
    ).eval()
    head = heads.vertical[0]
    with torch.no_grad():
        head.conv.weight.zero_()
        head.down.weight.zero_()  # h_hat = x: the drafted hidden state is W_left [e(x-1); e(x-2)]
        head.left.weight.zero_()
        head.left.weight[:, :32] = torch.eye(32) * 5  # h_hat = 5 e(code at x-1)
    context = torch.zeros(1, 32)
    codes = torch.arange(8)
    embeds = backbone.embed_codes(codes)
    drafts = torch.stack([heads.draft_step(context, torch.stack([embeds[c], torch.zeros(32)])[None])[0] for c in codes])
    torch.testing.assert_close(drafts, 5 * embeds)
    q = torch.softmax(backbone.code_logits(drafts), -1)  # [8 codes at x - 1, K]
    assert (q[:, None] - q[None]).abs().sum(-1).add(torch.eye(8) * 9).min() > 1e-3  # every code, its own q


def test_recurrent_unrolled_equals_stepwise_from_its_own_outputs():
    """The unrolled training row is what decoding runs: cell 0 reads a zero state, cell 1 the true state predicting
    cell 0, each later cell the drafter's own output to its left; the state is read (another first state changes
    every cell after cell 0), and a missing state is refused."""
    heads = randomise(row_heads("recurrent", left_codes=2))
    cols = 6
    hidden, embeds, row = torch.randn(3, cols, 16), torch.randn(3, cols, 12), torch.randn(3, cols, 12)
    states = torch.randn(3, cols, 16)
    forced = draft_below_teacher_forced(heads, hidden, embeds, row, states)
    context = heads.row_context(hidden, embeds)
    state = torch.zeros(3, 16)
    for x in range(cols):
        left = left_codes_of(heads, row, x)
        stepped = heads.draft_step(context[:, x], left, state)
        torch.testing.assert_close(forced[:, x], stepped)
        state = states[:, 0] if x == 0 else stepped
    other = draft_below_teacher_forced(heads, hidden, embeds, row, states.roll(1, dims=0))
    torch.testing.assert_close(other[:, 0], forced[:, 0], rtol=0, atol=0)
    assert not torch.allclose(other[:, 1:], forced[:, 1:])
    torch.testing.assert_close(  # only column 0 of the true states is read
        draft_below_teacher_forced(heads, hidden, embeds, row, torch.cat([states[:, :1], states[:, 1:] * 0], 1)),
        forced,
    )
    with pytest.raises(ValueError, match="reads the state predicting the cell to its left.*pass left_state"):
        heads.draft_step(context[:, 1], left)
    with pytest.raises(ValueError, match="only a 'recurrent' drafter reads the state"):
        row_heads("inrow").draft_step(context[:, 1], left, state)


def test_recurrent_unrolled_reads_the_true_state_where_true_left_says():
    """true_left [..., C] (training for exact's frontier): cell x >= 2 reads the true state predicting x - 1 where
    it is True, its own output there elsewhere; all False is the plain unroll, and cell 1 always reads the truth."""
    heads = randomise(row_heads("recurrent", left_codes=2))
    cols = 6
    hidden, embeds, row = torch.randn(2, cols, 16), torch.randn(2, cols, 12), torch.randn(2, cols, 12)
    states = torch.randn(2, cols, 16)
    true_left = torch.tensor([[False, False, True, False, True, True], [True, True, False, False, False, True]])
    forced = draft_below_teacher_forced(heads, hidden, embeds, row, states, true_left)
    context = heads.row_context(hidden, embeds)
    state = torch.zeros(2, 16)
    for x in range(cols):
        stepped = heads.draft_step(context[:, x], left_codes_of(heads, row, x), state)
        torch.testing.assert_close(forced[:, x], stepped)
        if x + 1 < cols:
            state = states[:, 0] if x == 0 else torch.where(true_left[:, x + 1, None], states[:, x], stepped)
    plain = draft_below_teacher_forced(heads, hidden, embeds, row, states)
    none_true = draft_below_teacher_forced(heads, hidden, embeds, row, states, torch.zeros_like(true_left))
    torch.testing.assert_close(none_true, plain, rtol=0, atol=0)
    assert not torch.allclose(forced[:, 3:], plain[:, 3:])
