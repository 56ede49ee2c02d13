"""The Fréchet distance of `ssd-bench peers` ranks what it should, on the shipped reference model.

Real renders < AR samples < the same AR samples with a tenth of their codes randomised; and `ssd` r=0, whose
adherence is close to AR's on some tasks, lands far from AR. 32 held-out captions, one image each, against the
features of 512 real renders of other held-out scenes.
"""

import numpy as np
import pytest
import torch

from ssd_bench.image_quality import code_histogram_distance, to_uint8
from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.decoding import ARDecoding, SSDDecoding
from ssd_pipelines.hub import BUNDLED_MODEL
from ssd_pipelines.reference.quality import WEIGHTS, frechet_distance, image_features, load_quality_net
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene
from ssd_pipelines.sampling_config import SamplingConfig

PROMPTS = 32


def test_the_network_ships_small_in_safetensors():
    assert WEIGHTS.suffix == ".safetensors" and WEIGHTS.stat().st_size < 1_000_000
    net = load_quality_net()
    assert all(p.dtype == torch.float32 for p in net.parameters())


def test_frechet_distance_matches_the_closed_form_for_gaussians():
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, size=(20_000, 3))
    b = rng.normal(1.0, 2.0, size=(20_000, 3))  # |mu|^2 = 3, tr = 3 + 12, -2 tr(sqrt(4 I)) = -12
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-9)
    assert frechet_distance(a, b) == pytest.approx(3 + 3 + 12 - 12, rel=0.05)


@pytest.fixture(scope="module")
def distances():
    torch.set_num_threads(1)
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    backbone, net = pipe.image_backbone, load_quality_net()
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(PROMPTS)]
    reference = image_features(net, [sample_scene(HELDOUT_SEED_START + 100_000 + i).image for i in range(512)])
    sampling = SamplingConfig(temperature=1.0, guidance_scale=3.0)
    prompts = backbone.encode_prompts([s.caption for s in scenes], guidance=True)
    ar = ARDecoding().decode(backbone, prompts, sampling, torch.Generator().manual_seed(0)).codes
    ssd = SSDDecoding(pipe.heads, verify_rounds=0).decode(backbone, prompts, sampling, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    noisy = torch.where(
        torch.rand(ar.shape, generator=generator) < 0.1,
        torch.randint(0, backbone.grid.codebook_size, ar.shape, generator=generator),
        ar,
    )
    sets = {
        "real": [sample_scene(HELDOUT_SEED_START + 200_000 + i).image for i in range(PROMPTS)],
        "ar": to_uint8(backbone.decode_codes(ar)),
        "ar, 10% of codes random": to_uint8(backbone.decode_codes(noisy)),
        "ssd r=0": to_uint8(backbone.decode_codes(ssd.codes)),
    }
    fd = {label: frechet_distance(image_features(net, images), reference) for label, images in sets.items()}
    fd["token distance, noisy"] = code_histogram_distance(noisy, ar, backbone.grid.codebook_size)
    return fd


def test_frechet_ranks_real_renders_then_ar_then_corrupted_ar(distances):
    assert distances["real"] < distances["ar"] < distances["ar, 10% of codes random"], distances
    assert distances["token distance, noisy"] > 0


def test_frechet_separates_ssd_without_verification_from_ar(distances):
    """Seen: 1278 against 231 (N = 48); two AR sets of 48 differed by 2x, so ask for 3x."""
    assert distances["ssd r=0"] > 3 * distances["ar"], distances
