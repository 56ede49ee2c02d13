"""Row drafters ("row", "inrow", "recurrent") in block `ssd` and on the frontier engine; the per-cell heads decode as before."""

import json

import pytest
import torch

import ssd_pipelines.decoding.exact as exact_module
from ssd_pipelines import ARDecoding, DraftHeads, ExactDecoding, SamplingConfig, SSDDecoding
from ssd_pipelines.testing import tiny_backbone, tiny_heads, tiny_pipeline
from ssd_pipelines.training.teacher_forcing import draft_below_teacher_forced

PROMPTS = ["a red circle", "blue square"]

# Recorded with the per-cell heads: tiny_pipeline(), "a red circle", two images, seed 0, with the noise layout of the
# engine that draws a pass's (or a block's) noise whole (sampling.NoiseTape). (codes of both images in raster order,
# forward passes, accepted cells per round)
BEFORE = {
    ("ssd", ()): (
        [[0, 6, 7, 2, 5, 7, 4, 4, 3, 5, 5, 4, 2, 0, 4, 6], [0, 6, 7, 2, 5, 7, 4, 4, 7, 5, 6, 4, 7, 2, 4, 6]],
        12,
        [1, 9],
    ),
    ("ssd", (("vertical_rows", 2), ("verify_rounds", 1))): (
        [[0, 6, 5, 4, 4, 3, 2, 4, 3, 2, 5, 6, 6, 4, 5, 5], [0, 6, 5, 4, 4, 3, 2, 6, 6, 7, 5, 4, 2, 0, 5, 4]],
        6,
        [4],
    ),
    ("ssd", (("window", 5), ("verify_rounds", 3))): (
        [[0, 6, 7, 4, 5, 7, 2, 4, 7, 0, 2, 4, 7, 2, 5, 6], [0, 6, 7, 4, 4, 4, 0, 5, 2, 4, 4, 4, 6, 4, 4, 4]],
        13,
        [2, 5, 5],
    ),
    ("exact", ()): (
        [[0, 6, 7, 4, 5, 7, 2, 4, 7, 5, 7, 6, 6, 4, 4, 4], [0, 6, 7, 4, 4, 4, 0, 5, 3, 5, 5, 4, 1, 6, 6, 4]],
        15,
        [2, 6, 12, 3],
    ),
}


def decode_pipe(pipe, decoding, options):
    out = pipe(
        "a red circle",
        num_images_per_prompt=2,
        decoding=decoding,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
        **dict(options),
    )
    return out.codes.flatten(1).tolist(), out.stats["forward_passes"], out.stats["accepted_per_round"]


def test_old_per_cell_heads_folder_decodes_as_before(tmp_path):
    """A heads folder saved before the new keys existed loads as per-cell heads and gives the recorded codes and
    statistics; so do heads built with vertical_drafter="cell" explicitly, from the same weights."""
    pipe = tiny_pipeline()
    pipe.heads.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("vertical_drafter", "row_kernel", "left_codes"):
        del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    old = DraftHeads.from_pretrained(tmp_path).eval()
    explicit = DraftHeads(**{**config, "vertical_drafter": "cell"}).eval()
    explicit.load_state_dict(pipe.heads.state_dict())
    for heads in (pipe.heads, old, explicit):
        pipe.heads = heads
        for (decoding, options), expected in BEFORE.items():
            assert decode_pipe(pipe, decoding, options) == expected, (decoding, options)


@pytest.mark.parametrize("drafter", ["row", "inrow", "recurrent"])
@pytest.mark.parametrize("guidance", [1.0, 3.0], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize(
    "strategy",
    [
        lambda heads: ExactDecoding(heads),
        lambda heads: ExactDecoding(heads, window=3),
        lambda heads: ExactDecoding(heads, window=20),
        lambda heads: SSDDecoding(heads, verify_rounds=None),
        lambda heads: SSDDecoding(heads, verify_rounds=None, window=8),
    ],
    ids=["exact", "exact-W=3", "exact-W=20", "ssd-no-cap", "pipelined-no-cap"],
)
def test_greedy_with_row_drafters_equals_ar_greedy(drafter, guidance, strategy):
    backbone = tiny_backbone(rows=5, cols=7, codebook_size=8)
    sampling = SamplingConfig(temperature=0, guidance_scale=guidance)
    prompts = backbone.encode_prompts(PROMPTS, num_images_per_prompt=2, guidance=sampling.uses_guidance)
    ar = ARDecoding().decode(backbone, prompts, sampling)
    out = strategy(tiny_heads(backbone, drafter=drafter)).decode(backbone, prompts, sampling)
    assert torch.equal(out.codes, ar.codes)
    assert out.stats.forward_passes < ar.stats.forward_passes


@pytest.mark.parametrize("drafter", ["row", "inrow", "recurrent"])
def test_row_drafters_draft_one_row(drafter):
    heads = tiny_heads(tiny_backbone(rows=4, cols=5, codebook_size=8), drafter=drafter)
    with pytest.raises(
        ValueError, match=rf"got 2. These heads' '{drafter}' vertical drafter drafts one row .*pass vertical_rows=1"
    ):
        SSDDecoding(heads, vertical_rows=2)
    pipe = tiny_pipeline()
    pipe.heads = heads
    with pytest.raises(ValueError, match="got 2. These heads' .* pass vertical_rows=1"):
        pipe("a", decoding="ssd", vertical_rows=2, output_type="latent")


@pytest.mark.parametrize("drafter", ["inrow", "recurrent"])
def test_block_ssd_drafts_a_row_left_to_right_from_the_codes_drawn(drafter):
    """Block ssd with in-row heads: the first cell's q is its exact distribution, every other cell's q is the
    teacher-forced draft from the codes drawn to its left (the ones returned): the q each code was drawn from.
    "recurrent" is unrolled from the true state predicting the first cell, h_next, as training unrolls it."""
    backbone = tiny_backbone(rows=3, cols=6, codebook_size=8)
    heads = tiny_heads(backbone, drafter=drafter)
    sampling = SamplingConfig(temperature=1.0, guidance_scale=3.0)
    strategy = SSDDecoding(heads, verify_rounds=1)
    seen = []
    original = SSDDecoding._draft_below

    def record(self, run, block, h_next, row_hidden, row_embeds, noise):
        codes, q = original(self, run, block, h_next, row_hidden, row_embeds, noise)
        seen.append((run, h_next.clone(), row_hidden.clone(), row_embeds.clone(), codes, q))
        return codes, q

    prompts = backbone.encode_prompts(PROMPTS, guidance=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SSDDecoding, "_draft_below", record)
        strategy.decode(backbone, prompts, sampling, generator=torch.Generator().manual_seed(3))
    assert len(seen) == 2  # rows 1 and 2
    for run, h_next, row_hidden, row_embeds, codes, q in seen:
        state = torch.cat([h_next[:, None], torch.randn_like(row_hidden[:, 1:])], dim=1)  # only column 0 is read
        forced = draft_below_teacher_forced(heads, row_hidden, row_embeds, run.embed_codes(codes), state)
        torch.testing.assert_close(q[:, 0], run.probs(h_next))
        torch.testing.assert_close(q[:, 1:], run.probs(forced[:, 1:]))


@pytest.mark.parametrize("drafter", ["row", "inrow", "recurrent"])
@pytest.mark.parametrize("window", [4, 8, 20])
def test_the_frontier_drafts_from_the_row_above_and_left_to_right(monkeypatch, drafter, window):
    """Every cell the frontier drafts below the first row: its q is the teacher-forced draft from the codes of the
    row above within the kernel and, for the in-row kinds, the codes to its left ("recurrent": and from the latest
    state of the cell to its left, zeros at the row's start). A draft read before its inputs had codes would read
    code 0 there instead, and miss."""
    backbone = tiny_backbone(rows=4, cols=5, codebook_size=8)
    heads = tiny_heads(backbone, drafter=drafter, row_kernel=3)
    cols, checked = 5, []

    class Recording(exact_module.FrontierRun):
        """Checks every cell a draft step gave a code. A cell reads what its inputs held when it was drafted: codes
        and states are written once in a draft step, so they hold the same after it."""

        def _draft(self, progress, noise):
            undrafted = self.run.codes < 0
            super()._draft(progress, noise)
            codes_now = self.run.codes
            for image, cell in (undrafted & (codes_now >= 0)).nonzero().tolist():
                if cell < cols:
                    continue
                y, x = divmod(cell, cols)
                rows = torch.tensor([image, image + len(PROMPTS)])  # both guidance branches
                hidden = self.hidden[rows][:, (y - 1) * cols : y * cols]
                codes = codes_now[image, (y - 1) * cols : (y + 1) * cols].clamp_min(0)  # outside: unread
                embeds = self.run.embed_codes(codes[None])
                if drafter == "recurrent":  # one step, from the state the frontier holds left of the cell
                    context = heads.row_context(hidden, embeds[:, :cols])[:, x]
                    columns = torch.arange(x - 1, x - 3, -1)
                    left = heads.start_embeds(embeds[:, cols + columns.clamp_min(0)], (columns < 0).expand(2, -1))
                    state = self.hidden[rows][:, cell - 1] if x > 0 else torch.zeros_like(context)
                    q = self.run.probs(heads.draft_step(context, left, state)[:, None])[:, 0]
                else:
                    forced = draft_below_teacher_forced(heads, hidden, embeds[:, :cols], embeds[:, cols:])
                    q = self.run.probs(forced[:, x])
                torch.testing.assert_close(self.q[image, cell % self.ring], q[0], rtol=1e-4, atol=1e-5)
                checked.append(cell)

    monkeypatch.setattr(exact_module, "FrontierRun", Recording)
    sampling = SamplingConfig(temperature=1.0, guidance_scale=3.0)
    prompts = backbone.encode_prompts(PROMPTS, guidance=True)
    ExactDecoding(heads, window=window).decode(backbone, prompts, sampling, generator=torch.Generator().manual_seed(1))
    assert len(checked) >= 10


def test_inrow_drafts_read_the_drafted_codes_to_their_left():
    """With weights that make a draft read only the code at x - 1, the drafted row copies its first (exact) code
    along the row through the backbone's greedy argmax: what cell x drafts follows what was drawn at x - 1."""
    backbone = tiny_backbone(rows=3, cols=6, codebook_size=8)
    heads = tiny_heads(backbone, drafter="inrow")
    head = heads.vertical[0]
    with torch.no_grad():
        head.conv.weight.zero_()
        head.down.weight.zero_()
        head.left.weight.zero_()
        head.left.weight[:, :32] = torch.eye(32)  # h_hat(x) = e(code at x - 1)
    sampling = SamplingConfig(temperature=0)
    prompts = backbone.encode_prompts(PROMPTS)
    follow = backbone.code_logits(backbone.embed_codes(torch.arange(8))).argmax(-1)  # code at x-1 -> draft at x
    drafted = []
    original = SSDDecoding._draft_below

    def record(self, run, block, h_next, row_hidden, row_embeds, noise):
        codes, q = original(self, run, block, h_next, row_hidden, row_embeds, noise)
        drafted.append(codes)
        return codes, q

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SSDDecoding, "_draft_below", record)
        SSDDecoding(heads, verify_rounds=1).decode(backbone, prompts, sampling)
    for codes in drafted:
        assert torch.equal(codes[:, 1:], follow[codes[:, :-1]])
    assert len(set(follow.tolist())) > 1  # different codes at x - 1 draft different codes at x
