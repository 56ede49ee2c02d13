"""The frontier engine's progress read one pass late (issue 51, point 3): on a GPU the host queues pass k + 1 on what
the device said before pass k, so it never waits for the pass the device runs. Forced here on the CPU: the codes are
those of a read after every pass, and the loop runs one idle pass more."""

import pytest
import torch

from ssd_pipelines.decoding.frontier import FrontierRun
from ssd_pipelines.testing import tiny_heads, tiny_pipeline

CALLS = [("exact", {}), ("ssd", {"verify_rounds": 2, "window": 5})]


def decode(pipe, decoding, options, rows=None):
    out = pipe(
        ["a red circle", "blue"],
        num_images_per_prompt=2,
        decoding=decoding,
        generator=[torch.Generator().manual_seed(seed) for seed in range(4)],
        output_type="latent",
        callback_on_step_end=None if rows is None else lambda p, row, t, tensors: rows.append((row, tensors["codes"])),
        **options,
    )
    return out.codes, out.stats


def read_late(monkeypatch) -> None:
    monkeypatch.setattr(FrontierRun, "reads_progress_late", property(lambda self: True))


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("drafter", ["cell", "inrow", "recurrent"])
def test_a_late_progress_read_gives_the_codes_of_a_read_every_pass_and_one_idle_pass(drafter, static, monkeypatch):
    pipe = tiny_pipeline()
    pipe.heads = tiny_heads(pipe.image_backbone, drafter=drafter)
    if static:  # the shapes a captured GPU run takes: every pass attends over all slots
        pipe.enable_compiled_passes(backend="eager", dynamic=False)
    on_time = [decode(pipe, *call) for call in CALLS]
    read_late(monkeypatch)
    for call, (codes, stats) in zip(CALLS, on_time):
        rows: list = []
        late_codes, late_stats = decode(pipe, *call, rows)
        assert torch.equal(late_codes, codes), call
        assert late_stats["forward_passes"] == stats["forward_passes"] + 1, call  # the last pass idles
        assert late_stats["drafted_per_round"] == stats["drafted_per_round"], call
        assert late_stats["accepted_per_round"] == stats["accepted_per_round"], call
        # every row reaches the callback, in order, final: as its codes end up
        assert [row for row, _ in rows] == list(range(codes.shape[1])), call
        for row, seen in rows:
            assert torch.equal(seen[:, row], codes[:, row]), (call, row)


def test_a_late_read_still_stops_where_the_callback_asks(monkeypatch):
    pipe = tiny_pipeline()
    read_late(monkeypatch)

    def stop(p, row, _timestep, _tensors):
        p._interrupt = row == 1
        return {}

    out = pipe(["a red circle"], decoding="exact", output_type="latent", callback_on_step_end=stop)
    assert out.rows_completed == 2 and out.stats["interrupted"]
    assert (out.codes[:, 2:] < 0).all() and (out.codes[:, :2] >= 0).all()
