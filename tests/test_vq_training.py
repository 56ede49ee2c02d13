"""VQ trainer smoke test on a tiny configuration, plus the encode/decode/save/load contract."""

import json

import numpy as np
import pytest
import torch

from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, make_dataset
from ssd_pipelines.training.vq import VQConfig, load_vq, main, save_vq, train_vq
from ssd_pipelines.vq import decode_codes, encode_images

TINY = {
    "block_out_channels": (8, 16, 16),
    "latent_channels": 4,
    "num_vq_embeddings": 64,
    "norm_num_groups": 4,
    "batch_size": 4,
    "warmup_steps": 5,
    "restart_every": 10,
    "eval_images": 8,
    "print_every": 1000,
}


@pytest.fixture(scope="module")
def trained():
    # Convolutions this small run faster on one thread, and far faster when the CPU is shared.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield train_vq(VQConfig(steps=40, **TINY))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def images():
    return np.stack([s.image for s in make_dataset(3, HELDOUT_SEED_START)])


def test_loss_falls_and_log_is_complete(trained):
    _, log = trained
    assert len(log["loss"]) == len(log["recon_loss"]) == len(log["vq_loss"]) == 40
    assert np.mean(log["loss"][-5:]) < 0.8 * np.mean(log["loss"][:5])
    assert log["restarts"][0] == [0, 64]  # step 0 initialises the whole codebook from encoder outputs
    assert 10.0 < log["heldout"]["psnr"] < 60.0
    assert 0.0 < log["heldout"]["codebook_usage"] <= 1.0
    json.dumps(log)


def test_encode_decode_shapes(trained, images):
    vq, _ = trained
    codes = encode_images(vq, images)
    assert codes.shape == (3, 16, 16) and codes.dtype == torch.long
    assert 0 <= int(codes.min()) and int(codes.max()) < 64
    recon = decode_codes(vq, codes)
    assert recon.shape == (3, 3, 64, 64) and recon.dtype == torch.float32
    assert 0.0 <= float(recon.min()) and float(recon.max()) <= 1.0
    # Decoding from indices is the same as the model's own quantize-then-decode path.
    x = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        direct = (vq(x).sample + 1) / 2
    torch.testing.assert_close(recon, direct.clamp(0, 1), atol=1e-4, rtol=0)


def test_save_load_round_trip_gives_identical_codes(trained, images, tmp_path):
    vq, _ = trained
    save_vq(vq, tmp_path / "fp32", dtype=torch.float32)
    assert torch.equal(encode_images(load_vq(tmp_path / "fp32"), images), encode_images(vq, images))
    save_vq(vq, tmp_path / "fp16")
    assert (tmp_path / "fp16" / "diffusion_pytorch_model.safetensors").exists()
    rounded = load_vq(tmp_path / "fp16")
    assert rounded.dtype == torch.float32
    again = tmp_path / "fp16_again"
    save_vq(rounded, again)
    assert torch.equal(encode_images(load_vq(again), images), encode_images(rounded, images))
    assert next(vq.parameters()).dtype == torch.float32  # save_vq leaves the trained model alone


def test_cli_writes_weights_and_log(tmp_path):
    out = tmp_path / "vq"
    main(
        ["--out", str(out), "--steps", "2", "--channels", "8,16,16", "--latent-channels", "4"]
        + ["--codebook-size", "64", "--norm-groups", "4", "--batch-size", "2", "--eval-images", "4"]
    )
    log = json.loads((out / "train_log.json").read_text())
    assert len(log["loss"]) == 2
    assert set(log["heldout_saved"]) == {"psnr", "codebook_usage"}
    assert load_vq(out).config.num_vq_embeddings == 64
