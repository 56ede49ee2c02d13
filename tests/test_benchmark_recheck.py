"""The re-check benchmark: its targets are the backbone's, its correction is the formula, and it runs end to end
(on tiny random models: the numbers mean nothing here)."""

import pytest
import torch

from ssd_bench.recheck import acceptance, main, recheck_cells
from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.sampling import reweighted, target_probs
from ssd_pipelines.sampling_config import SamplingConfig
from ssd_pipelines.testing import tiny_backbone, tiny_heads, tiny_vqvae
from ssd_pipelines.training.distill_data import teacher_forced_hidden

SAMPLING = SamplingConfig(guidance_scale=3.0)


def test_each_cell_gets_a_different_left_code_and_the_backbone_target_under_it():
    backbone = tiny_backbone(rows=4, cols=5, codebook_size=8)
    image = recheck_cells(
        backbone, "a red circle", SAMPLING, cells=6, min_col=2, generator=torch.Generator().manual_seed(3)
    )
    left = image.codes[0, image.rows, image.cols - 1]
    assert (image.redrawn != left).all() and (image.rows >= 1).all() and (image.cols >= 2).all()
    prompts = backbone.encode_prompts(["a red circle"], guidance=True)
    for i in range(6):
        y, x = int(image.rows[i]), int(image.cols[i])
        changed = image.codes.clone()
        changed[0, y, x - 1] = image.redrawn[i]
        p = target_probs(backbone.code_logits(teacher_forced_hidden(backbone, prompts, changed)), SAMPLING)
        torch.testing.assert_close(image.p_new[i], p[0, y, x])
    p = target_probs(backbone.code_logits(image.hidden), SAMPLING)[0]
    torch.testing.assert_close(image.p_old, p[image.rows, image.cols])


def test_the_correction_keeps_the_old_target_at_beta_0_and_is_exact_when_the_drafter_moves_as_the_backbone():
    p_old, p_new = torch.softmax(torch.randn(2, 5, 16), dim=-1)
    torch.testing.assert_close(reweighted(p_old, p_new, p_old, 0.0), p_old)
    torch.testing.assert_close(reweighted(p_old, p_old, p_new, 1.0), p_new)  # q_new / q_old = p_new / p_old
    torch.testing.assert_close(acceptance(p_new, p_new), torch.ones(5))
    assert (acceptance(p_old, p_new) < 1).all()


def in_row_model(folder, drafter: str):
    backbone = tiny_backbone(rows=4, cols=6, codebook_size=8)
    pipe = SSDAutoregressivePipeline(
        backbone.model, backbone.tokenizer, tiny_vqvae(8), tiny_heads(backbone, drafter=drafter)
    )
    pipe.save_pretrained(folder)
    return folder


def tables(printed: str) -> list[list[list[str]]]:
    """The markdown tables printed, each a list of rows of cells (header first, separator left out)."""
    out, rows = [], []
    for line in [*printed.splitlines(), ""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            out, rows = [*out, rows], []
    return out


def test_recheck_benchmark_scores_every_heads_on_the_same_cells_and_seeds(tmp_path, capsys):
    model = in_row_model(tmp_path / "model", "recurrent")
    heads = model / "heads"
    out = tmp_path / "recheck.md"
    two = ["--heads", f"a={heads}", "--heads", f"b={heads}"]
    sizes = ["--prompts", "2", "--cells", "3", "--exact-prompts", "2"]
    main(["--model", str(model), *two, *sizes, "--out", str(tmp_path / "two.md")])
    main(["--model", str(model), "--heads", f"a={heads}", *sizes, "--out", str(out)])
    proposals, passes, proposals_again, passes_again = tables(capsys.readouterr().out)
    header, a, b = proposals
    assert header[:4] == ["heads", "cells", "stale", "drafter"] and a[1] == "6"
    assert a[1:] == b[1:] == proposals_again[1][1:]  # the same grids, cells and redraws for every heads, every run
    assert all(0 <= float(value) <= 1 for value in a[2:])
    assert [row[:2] for row in passes[1:]] == [[h, p] for h in "ab" for p in ("off", "1", "2", "3")]
    counts = [float(row[2]) for row in passes[1:]]
    assert counts[:4] == counts[4:] == [float(row[2]) for row in passes_again[1:]]  # exact counts, same seeds
    assert all(1 <= c <= 24 for c in counts) and passes[1][5] == "1.00x"  # at most one pass per code of 4 x 6
    assert out.read_text().startswith("# exact's re-checks") and '--heads "a=' in out.read_text()


def test_recheck_benchmark_refuses_heads_that_do_not_read_the_left_code(tmp_path):
    model = in_row_model(tmp_path / "model", "row")
    with pytest.raises(SystemExit, match="a 'row' drafter does not read the code to a cell's left"):
        main(["--model", str(model), "--heads", f"row={model / 'heads'}", "--out", str(tmp_path / "out.md")])
