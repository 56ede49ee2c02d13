"""Meta's Chameleon VQGAN checkpoint (taming layout) loaded into a diffusers VQModel by key mapping.

The tiny checkpoints are written by the test in Meta's layout from two transformers
implementations of the same architecture, which then serve as references:
`ChameleonVQVAE` (encoder and quantizer, whose keys transformers copies from
vqgan.ckpt unchanged) and `JanusVQVAE`'s decoder (LlamaGen's taming decoder).
"""

import argparse
import pickle

import pytest
import torch
from tiny_backbones import VQGANShape, write_chameleon_tokenizer

from ssd_pipelines.backbones.chameleon_vqgan import load_chameleon_vqgan
from ssd_pipelines.vq import decode_codes


@pytest.mark.parametrize("attention", [True, False])
def test_encoder_gives_chameleons_codes(tmp_path, attention):
    references = write_chameleon_tokenizer(tmp_path, VQGANShape(attention=attention))
    vq = load_chameleon_vqgan(tmp_path)
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        _, _, (_, _, codes) = vq.quantize(vq.quant_conv(vq.encoder(images)))
        theirs = references["encoder"].encode(images).image_tokens
    assert torch.equal(codes.view(-1), theirs.view(-1))
    assert vq.config.down_block_types[-1] == ("AttnDownEncoderBlock2D" if attention else "DownEncoderBlock2D")


@pytest.mark.parametrize("suffix", ["ckpt", "safetensors"])
def test_decoder_draws_what_the_taming_decoder_draws(tmp_path, suffix):
    references = write_chameleon_tokenizer(tmp_path, VQGANShape(attention=True), suffix=suffix)
    vq = load_chameleon_vqgan(tmp_path)
    codes = torch.randint(0, 12, (2, 8, 8), generator=torch.Generator().manual_seed(1))
    janus = references["decoder"]
    with torch.no_grad():
        latents = references["encoder"].quantize.embedding(codes).permute(0, 3, 1, 2)  # [B, C, h, w]
        theirs = janus.decoder(janus.post_quant_conv(latents))  # [-1, 1]
    pixels = decode_codes(vq, codes)
    assert pixels.shape == (2, 3, 16, 16)
    torch.testing.assert_close(pixels, ((theirs + 1) / 2).clamp(0, 1), atol=1e-5, rtol=1e-5)


def test_a_pickle_carrying_code_is_refused(tmp_path):
    write_chameleon_tokenizer(tmp_path, VQGANShape())
    state = torch.load(tmp_path / "vqgan.ckpt", weights_only=True)
    state["hyper_parameters"] = argparse.Namespace(lr=1e-4)  # as training frameworks store them: not a tensor
    torch.save(state, tmp_path / "vqgan.ckpt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_chameleon_vqgan(tmp_path)


def test_missing_or_mismatched_files_say_what_to_pass(tmp_path):
    with pytest.raises(ValueError, match=r"vqgan.yaml and vqgan.ckpt\). Download Chameleon from https://ai.meta.com"):
        load_chameleon_vqgan(tmp_path)
    write_chameleon_tokenizer(tmp_path / "a", VQGANShape(attention=True))
    write_chameleon_tokenizer(tmp_path / "b", VQGANShape(attention=False))
    (tmp_path / "a" / "vqgan.ckpt").replace(tmp_path / "b" / "vqgan.ckpt")
    with pytest.raises(ValueError, match="does not match .*unexpected .*attentions"):
        load_chameleon_vqgan(tmp_path / "b")
