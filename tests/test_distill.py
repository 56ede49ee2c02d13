"""Self-distillation of the drafting heads: the data, the loss pairs, training, and the accelerate CLI."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator

from ssd_pipelines import ARDecoding, DraftHeads, SamplingConfig, SSDDecoding
from ssd_pipelines.testing import tiny_backbone, tiny_heads, tiny_llama, tiny_tokenizer
from ssd_pipelines.training.distill import main
from ssd_pipelines.training.distill_data import (
    DistillationData,
    collect,
    rollout_images,
    shard_folder,
    teacher_forced_hidden,
)
from ssd_pipelines.training.head_loss import HeadLosses, batch_loss, distill_loss, head_offsets, heldout_acceptance
from ssd_pipelines.training.head_training import train_heads

PROMPTS = ["a red circle", "blue square", "the green square left of a circle", "red"]


@pytest.fixture(scope="module")
def grid6():
    """6 x 6 codes: room for all five horizontal and both vertical heads."""
    return tiny_backbone(rows=6, cols=6, codebook_size=8)


def test_collect_keeps_both_branches_per_image_in_16_bits(backbone):
    sampling = SamplingConfig(guidance_scale=2.0)
    data = collect(backbone, PROMPTS[:3], sampling, images_per_prompt=3, batch_size=4, seed=5)
    assert data.hidden.shape == (9, 2, 4, 5, 32) and data.codes.shape == (9, 4, 5)
    assert data.hidden.dtype == torch.float16 and data.hidden.device.type == "cpu"
    # One batch reproduces the same decode directly: conditional rows are branch 0, unconditional branch 1.
    data = collect(backbone, PROMPTS[:2], sampling, images_per_prompt=2, seed=5)
    batch = backbone.encode_prompts([p for p in PROMPTS[:2] for _ in range(2)], guidance=True)
    out = ARDecoding(record_hidden=True).decode(backbone, batch, sampling, generator=torch.Generator().manual_seed(5))
    assert torch.equal(data.codes, out.codes.int())
    torch.testing.assert_close(data.hidden[:, 0], out.hidden[:4].half())
    torch.testing.assert_close(data.hidden[:, 1], out.hidden[4:].half())


@pytest.mark.parametrize("eol", [True, False], ids=["eol", "no-eol"])
def test_teacher_forced_hidden_is_what_ar_records_as_it_samples(eol):
    backbone = tiny_backbone(rows=4, cols=5, codebook_size=8, eol=eol)
    sampling = SamplingConfig(guidance_scale=2.0)
    batch = backbone.encode_prompts(PROMPTS[:3], guidance=True)  # different lengths: left-padded
    ar = ARDecoding(record_hidden=True).decode(backbone, batch, sampling, generator=torch.Generator().manual_seed(1))
    # a block pass rounds differently from one-token passes: equal up to float32 rounding, not bit for bit
    torch.testing.assert_close(teacher_forced_hidden(backbone, batch, ar.codes), ar.hidden, atol=2e-4, rtol=1e-4)


def test_collect_decodes_the_first_batches_with_the_rollout_strategy(backbone):
    """Rollout batches hold the strategy's own codes and the states one pass over them gives; the rest is AR's."""
    sampling = SamplingConfig(guidance_scale=2.0)
    ssd = SSDDecoding(tiny_heads(backbone), verify_rounds=1)
    data = collect(backbone, PROMPTS, sampling, batch_size=2, seed=5, rollout=ssd, rollout_share=0.5)
    first = backbone.encode_prompts(PROMPTS[:2], guidance=True)
    drafted = ssd.decode(backbone, first, sampling, generator=torch.Generator().manual_seed(5))
    assert torch.equal(data.codes[:2], drafted.codes.int())
    hidden = teacher_forced_hidden(backbone, first, drafted.codes)
    torch.testing.assert_close(data.hidden[:2], hidden.unflatten(0, (2, 2)).transpose(0, 1).half())
    second = backbone.encode_prompts(PROMPTS[2:], guidance=True)
    generator = torch.Generator().manual_seed(5 + 1_000_003)  # the second batch's own stream
    assert torch.equal(data.codes[2:], ARDecoding().decode(backbone, second, sampling, generator=generator).codes.int())
    ar = collect(backbone, PROMPTS, sampling, batch_size=2, seed=5)
    assert torch.equal(data.codes[2:], ar.codes[2:]) and not torch.equal(data.codes[:2], ar.codes[:2])


def test_rollouts_are_whole_batches_of_the_share_asked_for():
    assert [rollout_images(100, 16, share) for share in (0, 0.1, 0.5, 1)] == [0, 16, 64, 100]
    with pytest.raises(ValueError, match=r"share of the images: pass a value in \[0, 1\], got 1.5"):
        rollout_images(100, 16, 1.5)


def test_loss_is_smooth_l1_between_the_right_cells(backbone):
    """Checked cell by cell against a direct computation; border cells without a target are left out."""
    heads = tiny_heads(backbone, horizontal=(1, 2), vertical=(1,))
    gen = torch.Generator().manual_seed(0)
    rows, cols = 3, 4
    data = DistillationData(
        torch.randn(2, 2, rows, cols, 32, generator=gen), torch.randint(0, 8, (2, rows, cols), generator=gen)
    )
    loss, per_head = distill_loss(heads, backbone, data)
    names = [name for name, _, _ in head_offsets(heads)]
    assert names == ["horizontal_1", "horizontal_2", "vertical_1"]
    torch.testing.assert_close(loss, per_head.sum())

    embeds = backbone.embed_codes(data.codes.long()).detach()

    def direct(head, dy, dx):
        pairs = [
            (head(data.hidden[n, s, y, x], embeds[n, y, x]), data.hidden[n, s, y + dy, x + dx])
            for n in range(2)
            for s in range(2)
            for y in range(rows - dy)
            for x in range(cols - dx)
        ]
        assert len(pairs) == 2 * 2 * (rows - dy) * (cols - dx)
        return F.smooth_l1_loss(torch.stack([p for p, _ in pairs]), torch.stack([t for _, t in pairs]))

    torch.testing.assert_close(per_head[1], direct(heads.horizontal[1], 0, 2).detach())
    torch.testing.assert_close(per_head[2], direct(heads.vertical[0], 1, 0).detach())


def test_a_head_with_no_cell_in_the_grid_is_refused(backbone):
    heads = tiny_heads(backbone)  # five horizontal heads: too many for 4 columns
    data = DistillationData(torch.zeros(1, 1, 3, 4, 32), torch.zeros(1, 3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="horizontal_4 has no target cell in a 3x4 grid"):
        distill_loss(heads, backbone, data)


def test_training_lowers_the_loss_and_leaves_the_backbone_alone(grid6):
    data = collect(grid6, PROMPTS, SamplingConfig(guidance_scale=2.0), images_per_prompt=8, seed=0)
    before = {k: v.clone() for k, v in grid6.model.state_dict().items()}
    heads = tiny_heads(grid6)
    log = train_heads(
        heads, grid6, data, steps=30, lr=1e-2, batch_size=8, accelerator=Accelerator(cpu=True), log_every=10
    )
    assert [step for step, _ in log["loss"]] == [0, 10, 20, 29] and log["steps"] == 30
    assert log["loss"][-1][1] < 0.9 * log["loss"][0][1]
    assert set(log["final_per_head"]) == {name for name, _, _ in head_offsets(heads)}
    assert all(torch.equal(before[k], v) for k, v in grid6.model.state_dict().items())
    assert all(p.grad is None for p in grid6.model.parameters())
    assert not heads.training


def _acceptance(heads: DraftHeads, backbone, sampling: SamplingConfig) -> float:
    batch = backbone.encode_prompts(PROMPTS, num_images_per_prompt=16, guidance=sampling.uses_guidance)
    out = SSDDecoding(heads, verify_rounds=1).decode(
        backbone, batch, sampling, generator=torch.Generator().manual_seed(1)
    )
    return out.stats.acceptance_per_round[0]


def test_trained_heads_get_more_drafts_accepted(grid6):
    """Seen on this machine: first-round acceptance 0.20 untrained -> about 0.5 after 100 steps."""
    sampling = SamplingConfig(temperature=1.0)
    data = collect(grid6, PROMPTS, sampling, images_per_prompt=32, seed=0)
    heads = tiny_heads(grid6)
    untrained = _acceptance(heads, grid6, sampling)
    train_heads(heads, grid6, data, steps=100, lr=1e-2, batch_size=32, accelerator=Accelerator(cpu=True), log_every=50)
    trained = _acceptance(heads, grid6, sampling)
    print(f"first-round acceptance: untrained {untrained:.3f}, trained {trained:.3f}")
    assert trained > untrained + 0.15


def _tiny_cli(tmp_path, prompts: list[str], *options: str) -> list[str]:
    """argv of a --tiny-random run that writes its heads and log to tmp_path/heads."""
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    return ["--tiny-random", "--prompts", str(tmp_path / "prompts.txt"), "--out", str(tmp_path / "heads"), *options]


def test_cli_runs_on_one_process(tmp_path):
    main(_tiny_cli(tmp_path, PROMPTS, "--steps", "3", "--log-every", "1"))
    log = json.loads((tmp_path / "heads" / "distill_log.json").read_text())
    assert len(log["processes"]) == 1 and log["processes"][0]["images"] == 4
    assert log["processes"][0]["steps"] == 3 and len(log["loss"]) == 3
    assert DraftHeads.from_pretrained(tmp_path / "heads").config.base_model == "ssd-pipelines/tiny-random"


def test_cli_trains_an_in_row_drafter_on_the_kl_loss(tmp_path):
    options = ("--vertical", "1", "--vertical-drafter", "inrow", "--left-codes", "3", "--row-kernel", "3")
    main(_tiny_cli(tmp_path, PROMPTS, *options, "--loss", "kl", "--guidance", "2", "--steps", "4", "--log-every", "1"))
    log = json.loads((tmp_path / "heads" / "distill_log.json").read_text())
    assert log["config"]["loss"] == "kl" and len(log["loss"]) == 4
    config = DraftHeads.from_pretrained(tmp_path / "heads").config
    assert (config.vertical_drafter, config.left_codes, config.row_kernel) == ("inrow", 3, 3)


def test_cli_loads_a_saved_backbone_folder(tmp_path):
    tiny_llama(rows=3, cols=4, codebook_size=8).save_pretrained(tmp_path / "model" / "backbone")
    tiny_tokenizer().save_pretrained(tmp_path / "model" / "tokenizer")
    (tmp_path / "prompts.txt").write_text("a red circle\n")
    out = tmp_path / "heads"
    options = ["--horizontal", "3", "--vertical", "2", "--steps", "2", "--base-model", "tests/saved-tiny"]
    main(["--model", str(tmp_path / "model"), "--prompts", str(tmp_path / "prompts.txt"), "--out", str(out), *options])
    heads = DraftHeads.from_pretrained(out)
    assert heads.config.base_model == "tests/saved-tiny" and heads.max_horizontal == 3


def test_cli_warns_when_accelerate_started_one_process_for_several(tmp_path, monkeypatch):
    """What `accelerate launch --cpu --num_processes 2` does without mpirun: MASTER_PORT set, one process."""
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.warns(UserWarning, match="ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu"):
        main(_tiny_cli(tmp_path, ["red"], "--steps", "1"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_accelerate_launch_splits_generation_and_training_over_two_processes(tmp_path):
    """Two CPU processes via `--multi_gpu` and ACCELERATE_USE_CPU (`--cpu --num_processes 2` starts one without mpirun)."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(_free_port())]
    launch += ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    launch += ["--dynamo_backend", "no", "-m", "ssd_pipelines.training.distill"]
    options = ["--images-per-prompt", "3", "--guidance", "2", "--steps", "12", "--batch-size", "4"]
    argv = launch + _tiny_cli(tmp_path, PROMPTS, *options, "--log-every", "4", "--lr", "1e-2")
    result = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    log = json.loads((tmp_path / "heads" / "distill_log.json").read_text())
    processes = sorted(log["processes"], key=lambda p: p["process_index"])
    assert [p["process_index"] for p in processes] == [0, 1]
    assert [p["images"] for p in processes] == [6, 6] and [p["steps"] for p in processes] == [12, 12]
    assert [step for step, _ in log["loss"]] == [0, 4, 8, 11] and len(log["final_per_head"]) == 7
    heads = DraftHeads.from_pretrained(tmp_path / "heads")
    assert heads.max_horizontal == 5 and heads.max_vertical == 2


def test_collection_streams_to_shards_and_resumes_from_them(backbone, tmp_path):
    """A collection stopped after some batches continues from its shards and ends with the same data."""
    sampling = SamplingConfig(guidance_scale=2.0)
    whole = collect(backbone, PROMPTS[:3], sampling, images_per_prompt=3, batch_size=4, seed=5, shards=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"batch-0000{i}.safetensors" for i in range(3)]
    (tmp_path / "batch-00002.safetensors").unlink()  # as if stopped before the last batch
    first = tmp_path / "batch-00000.safetensors"
    first_written = first.stat().st_mtime_ns
    resumed = collect(backbone, PROMPTS[:3], sampling, images_per_prompt=3, batch_size=4, seed=5, shards=tmp_path)
    assert first.stat().st_mtime_ns == first_written  # read back, not generated again
    assert torch.equal(resumed.codes, whole.codes) and torch.equal(resumed.hidden, whole.hidden)


def test_a_data_dir_of_other_settings_is_refused(tmp_path):
    shard_folder(tmp_path, {"seed": 0}, 0)
    with pytest.raises(ValueError, match="holds generations made with other settings"):
        shard_folder(tmp_path, {"seed": 1}, 0)


def _random_data(backbone, images=2, rows=3, cols=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(images, 2, rows, cols, 32, generator=gen)
    return DistillationData(hidden, torch.randint(0, 8, (images, rows, cols), generator=gen))


def test_kl_and_tv_losses_compare_the_verifiers_guided_distributions(backbone):
    """p from the true state, q from the head's, both through the backbone's norm and head, guided as sampled."""
    heads = tiny_heads(backbone, horizontal=(1,), vertical=(1,))
    data = _random_data(backbone)
    sampling = SamplingConfig(guidance_scale=3.0)
    _, kl = distill_loss(heads, backbone, data, loss="kl", sampling=sampling)
    _, tv = distill_loss(heads, backbone, data, loss="tv", sampling=sampling)
    _, both = distill_loss(heads, backbone, data, loss="kl+smooth_l1", sampling=sampling)
    _, l1 = distill_loss(heads, backbone, data)

    hidden, embeds = data.hidden, backbone.embed_codes(data.codes.long()).detach()
    predicted = heads.vertical[0](hidden[:, :, :-1], embeds[:, None, :-1].expand(-1, 2, -1, -1, -1))

    def guided(h):  # [b, 2, ..., d] -> [b, ..., K], written out: uncond + s (cond - uncond)
        logits = backbone.code_logits(h)
        return (logits[:, 1] + 3.0 * (logits[:, 0] - logits[:, 1])).softmax(-1)

    p, q = guided(hidden[:, :, 1:]), guided(predicted)
    torch.testing.assert_close(kl[1], (p * (p.log() - q.log())).sum(-1).mean(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(tv[1], 0.5 * (p - q).abs().sum(-1).mean(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(both, kl + l1, rtol=1e-4, atol=1e-6)
    assert bool((tv > 0).all() and (tv < 1).all())


def test_a_distribution_loss_needs_the_backbone_and_a_sampling_config(backbone):
    heads = tiny_heads(backbone, horizontal=(1,), vertical=(1,))
    with pytest.raises(ValueError, match="loss 'kl' compares distributions: pass the backbone and the sampling"):
        HeadLosses(heads, "kl")
    with pytest.raises(ValueError, match="unknown loss 'mse': choose one of smooth_l1, kl, kl\\+smooth_l1, tv"):
        distill_loss(heads, backbone, _random_data(backbone), loss="mse")


def test_training_on_kl_raises_the_acceptance_it_measures(backbone):
    """What the loss is for: acceptance sum_k min(p, q) of the vertical head's drafts rises on the data trained on."""
    heads = tiny_heads(backbone, horizontal=(1,), vertical=(1,))
    sampling = SamplingConfig(guidance_scale=2.0)
    data = collect(backbone, PROMPTS, sampling, images_per_prompt=4, batch_size=16, seed=1)
    _, before = distill_loss(heads, backbone, data, loss="tv", sampling=sampling)
    train_heads(heads, backbone, data, steps=60, lr=3e-3, batch_size=8, log_every=20, loss="kl", sampling=sampling)
    _, after = distill_loss(heads, backbone, data, loss="tv", sampling=sampling)
    assert float(after[1]) < float(before[1]) - 0.02, (before, after)


def test_cli_trains_a_recurrent_drafter_and_reports_heldout_acceptance(tmp_path):
    """--eval-images holds images out of training and logs each head's teacher-forced 1 - TV on them, which is
    what heldout_acceptance computes from the saved heads."""
    prompts = [f"{p} {i}" for i in range(3) for p in PROMPTS]  # 12 images: 8 to train on, 4 held out
    options = ("--vertical", "1", "--vertical-drafter", "recurrent", "--loss", "kl", "--guidance", "2")
    main(_tiny_cli(tmp_path, prompts, *options, "--steps", "3", "--eval-images", "4"))
    log = json.loads((tmp_path / "heads" / "distill_log.json").read_text())
    assert log["processes"][0]["images"] == 8
    accepted = log["heldout_acceptance"]
    assert set(accepted) == {
        "horizontal_1",
        "horizontal_2",
        "horizontal_3",
        "horizontal_4",
        "horizontal_5",
        "vertical_1",
    }
    assert all(0 < value <= 1 for value in accepted.values())
    heads = DraftHeads.from_pretrained(tmp_path / "heads")
    assert heads.drafter == "recurrent" and heads.reads_left_state
    with pytest.raises(ValueError, match="--eval-images 12 must be between 1 and 11"):
        main(_tiny_cli(tmp_path, prompts, "--steps", "1", "--eval-images", "12"))


def test_true_state_share_trains_a_recurrent_drafter_on_the_true_left_states(backbone):
    """At share 0 the loss is the plain unroll's; at 1 every cell reads the true state to its left, which changes
    it; a share outside [0, 1], or one for heads that read no state, is refused."""
    heads = tiny_heads(backbone, horizontal=(1,), vertical=(1,), drafter="recurrent")
    sampling = SamplingConfig(guidance_scale=2.0)
    data = _random_data(backbone)
    _, plain = distill_loss(heads, backbone, data, loss="kl", sampling=sampling)
    _, zero = batch_loss(HeadLosses(heads, "kl", backbone, sampling, true_state_share=0.0), backbone, data)
    _, every = batch_loss(HeadLosses(heads, "kl", backbone, sampling, true_state_share=1.0), backbone, data)
    torch.testing.assert_close(zero, plain, rtol=0, atol=0)
    assert float((every[1] - plain[1]).abs()) > 1e-4 and torch.equal(every[0], plain[0])  # horizontal head alike
    with pytest.raises(ValueError, match=r"true_state_share is a share of cells: pass a value in \[0, 1\], got 1.5"):
        HeadLosses(heads, "kl", backbone, sampling, true_state_share=1.5)
    with pytest.raises(ValueError, match="true_state_share is for a 'recurrent' drafter.*vertical_drafter='cell'"):
        HeadLosses(tiny_heads(backbone, horizontal=(1,), vertical=(1,)), "kl", backbone, sampling, 0.5)


def test_cli_refuses_a_true_state_share_for_heads_that_read_no_state(tmp_path):
    options = ("--vertical", "1", "--vertical-drafter", "inrow", "--true-state-share", "0.5")
    with pytest.raises(ValueError, match="true_state_share is for a 'recurrent' drafter.*'inrow'"):
        main(_tiny_cli(tmp_path, PROMPTS, *options))
    assert not (tmp_path / "heads").exists()


def test_heldout_acceptance_is_one_minus_the_tv_loss(backbone):
    heads = tiny_heads(backbone, horizontal=(1,), vertical=(1,), drafter="recurrent")
    sampling = SamplingConfig(guidance_scale=2.0)
    data = collect(backbone, PROMPTS, sampling, images_per_prompt=3, batch_size=16, seed=2)
    _, tv = distill_loss(heads, backbone, data, loss="tv", sampling=sampling)
    accepted = heldout_acceptance(heads, backbone, data, sampling, batch_size=5)  # uneven batches: weighted means
    torch.testing.assert_close(torch.tensor(list(accepted.values())), 1 - tv, atol=1e-4, rtol=0)


def test_cli_takes_the_horizontal_heads_and_trains_only_the_vertical_drafter(tmp_path):
    main(_tiny_cli(tmp_path, PROMPTS, "--steps", "2"))
    first = DraftHeads.from_pretrained(tmp_path / "heads")
    options = ("--vertical", "1", "--vertical-drafter", "inrow", "--horizontal-from", str(tmp_path / "heads"))
    second = tmp_path / "second"
    main([*_tiny_cli(tmp_path, PROMPTS, *options, "--steps", "3", "--lr", "0.1"), "--out", str(second)])
    trained = DraftHeads.from_pretrained(second)
    for name, tensor in first.horizontal.state_dict().items():
        assert torch.equal(trained.horizontal.state_dict()[name], tensor), name  # copied, and never stepped
    assert set(json.loads((second / "distill_log.json").read_text())["final_per_head"]) == {"vertical_1"}
    with pytest.raises(ValueError, match="do not fit.*same --horizontal"):
        main([*_tiny_cli(tmp_path, PROMPTS, "--horizontal", "2", "--horizontal-from", str(second))])


def test_cli_trains_on_the_rollouts_of_given_heads(tmp_path):
    """--rollout-heads: the first share of the images decoded by ssd with those heads, recorded with the data
    dir's settings; refused where the rollouts would reach the held-out images, and for heads of another shape."""
    prompts = [f"{p} {i}" for i in range(2) for p in PROMPTS]  # 8 images
    main(_tiny_cli(tmp_path, prompts, "--steps", "1"))
    options = ("--rollout-heads", str(tmp_path / "heads"), "--generate-batch-size", "2", "--steps", "2")
    second = ["--out", str(tmp_path / "second"), "--data-dir", str(tmp_path / "data")]
    main([*_tiny_cli(tmp_path, prompts, *options, "--rollout-share", "0.25", "--eval-images", "4"), *second])
    settings = json.loads((tmp_path / "data" / "collection.json").read_text())
    assert (settings["rollout_heads"], settings["rollout_share"], settings["rollout_rounds"]) == (
        str(tmp_path / "heads"),
        0.25,
        2,
    )
    assert json.loads((tmp_path / "second" / "distill_log.json").read_text())["processes"][0]["images"] == 4
    with pytest.raises(ValueError, match="6 of this process's 8 images would be rollouts.*last 4 held out"):
        main(_tiny_cli(tmp_path, prompts, *options, "--rollout-share", "0.7", "--eval-images", "4"))
    tiny_heads(tiny_backbone(rows=6, cols=6, codebook_size=16)).save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="do not fit this backbone"):
        main(_tiny_cli(tmp_path, prompts, "--rollout-heads", str(tmp_path / "other")))
