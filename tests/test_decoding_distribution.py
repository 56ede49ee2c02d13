"""`exact` samples the AR distribution; `ssd` approaches it as rounds grow; wrong verifiers are caught.

On an enumerable 2 x 3 grid of 3 codes (729 images) the exact AR probability of
every image is known, so the total-variation distance of 20,000 samples can be
compared with the noise floor of an exact sampler drawing as many.
"""

import pytest
import torch

import ssd_pipelines.decoding.ssd as ssd_module
from ssd_pipelines import ARDecoding, ExactDecoding, SamplingConfig, SSDDecoding
from ssd_pipelines.benchmarks.exactness import TOY_PROMPT, grid_probabilities, measure, noise_floor, toy_setup
from ssd_pipelines.sampling import residual, sample, verify_round

SAMPLES = 20_000
SAMPLING = SamplingConfig(temperature=1.0, guidance_scale=2.0)


@pytest.fixture(scope="module")
def toy():
    torch.set_num_threads(1)
    backbone, heads = toy_setup()
    probs = grid_probabilities(backbone, TOY_PROMPT, SAMPLING)
    floor, spread = noise_floor(probs, SAMPLES)
    bound = floor + 5 * spread  # about 0.03; the wrong verifiers below land at 0.15 and more
    return backbone, heads, probs, bound


def tv(toy, strategy, seed):
    backbone, _, probs, _ = toy
    return measure(strategy, backbone, SAMPLING, SAMPLES, seed, probs).total_variation


def test_the_toy_distribution_is_a_hard_one(toy):
    _, _, probs, _ = toy
    assert abs(float(probs.sum()) - 1) < 1e-5
    entropy_bits = -(probs * probs.clamp_min(1e-30).log2()).sum()
    assert probs.max() < 0.3 and entropy_bits > 3.5  # many likely images, none dominant


def test_ar_sits_at_the_noise_floor(toy):
    assert tv(toy, ARDecoding(), seed=1) < toy[3]


def test_exact_sits_at_the_noise_floor(toy):
    assert tv(toy, ExactDecoding(toy[1]), seed=2) < toy[3]


def test_ssd_total_variation_falls_with_rounds(toy):
    """Blocks here hold 3 cells: the first is exact, each round fixes one more, so r = 2 is already exact."""
    distances = [tv(toy, SSDDecoding(toy[1], verify_rounds=r), seed=3 + r) for r in range(4)]
    assert distances[0] > distances[1] > toy[3] > max(distances[2:]), distances


def _accept_with_p(tokens, q, p, generator=None):
    p_token = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    accepted = torch.rand(tokens.shape, generator=generator) < p_token
    return torch.where(accepted, tokens, sample(residual(p, q), generator)), p, accepted


def _skip_residual(tokens, q, p, generator=None):
    p_token = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    q_token = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    accepted = torch.rand(tokens.shape, generator=generator) * q_token < p_token
    return torch.where(accepted, tokens, sample(p, generator)), p, accepted


def _keep_head_q(tokens, q, p, generator=None):
    """The rule SJD uses: the next q is the distribution each token was drawn from."""
    new_tokens, _, accepted = verify_round(tokens, q, p, generator)
    return new_tokens, torch.where(accepted.unsqueeze(-1), q, residual(p, q)), accepted


@pytest.mark.parametrize("wrong_round", [_accept_with_p, _skip_residual, _keep_head_q])
def test_a_wrong_verifier_is_caught(toy, monkeypatch, wrong_round):
    monkeypatch.setattr(ssd_module, "verify_round", wrong_round)
    assert tv(toy, ExactDecoding(toy[1]), seed=9) > 2 * toy[3]
