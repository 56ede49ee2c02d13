import pytest
import torch

from ssd_pipelines.sampling import (
    ImageGenerators,
    NoiseTape,
    residual,
    reweighted,
    sample,
    target_probs,
    uniform,
    verify_round,
)
from ssd_pipelines.sampling_config import MAX_GUIDANCE_SCALE, SamplingConfig
from ssd_pipelines.testing import tiny_pipeline


def test_greedy_is_one_hot_on_the_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    probs = target_probs(logits, SamplingConfig(temperature=0))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_guidance_combines_the_two_branches_of_one_batch():
    cond, uncond = torch.randn(2, 5), torch.randn(2, 5)
    probs = target_probs(torch.cat([cond, uncond]), SamplingConfig(guidance_scale=3.0, temperature=0.5))
    expected = ((uncond + 3.0 * (cond - uncond)) / 0.5).softmax(-1)
    assert probs.shape == (2, 5)
    torch.testing.assert_close(probs, expected)


def test_top_k_and_top_p_keep_the_right_codes():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top_k = target_probs(logits, SamplingConfig(top_k=2))
    torch.testing.assert_close(top_k, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    top_p = target_probs(logits, SamplingConfig(top_p=0.7))  # 0.5 + 0.3 reach 0.7
    torch.testing.assert_close(top_p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must lie in \(0, 1\]"),
        ({"top_k": 0}, "top_k must be a positive integer"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"guidance_scale": 0.5}, r"guidance_scale must lie in \[1, 10000\] \(1 disables"),
        (
            {"guidance_scale": 1e308},
            (
                r"guidance_scale must lie in \[1, 10000\] .* past 10000 each cell already takes its likeliest code, so "
                r"it no longer changes the image\), got 1e\+308"
            ),
        ),
        ({"guidance_scale": 10_001.0}, r"guidance_scale must lie in \[1, 10000\]"),
    ],
)
def test_bad_sampling_settings_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_the_largest_guidance_scale_still_draws_from_finite_probabilities():
    logits = torch.randn(2, 5, 512) * 20  # conditional row, then unconditional
    probs = target_probs(logits, SamplingConfig(guidance_scale=MAX_GUIDANCE_SCALE))
    assert probs.isfinite().all() and torch.allclose(probs.sum(-1), torch.ones(1, 5))


def test_residual_keeps_only_the_mass_p_has_beyond_q():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    torch.testing.assert_close(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual(p, p), p)  # never used, but a valid distribution


def test_one_round_turns_samples_of_q_into_samples_of_p():
    """The speculative-sampling identity the whole method rests on, cell by cell."""
    generator = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.4, 0.4, 0.1, 0.1])
    n = 200_000
    q_batch, p_batch = q.expand(1, n, 4), p.expand(1, n, 4)
    tokens = sample(q_batch, generator)
    verified, next_q, accepted = verify_round(tokens, q_batch, p_batch, generator)
    frequencies = torch.bincount(verified.flatten(), minlength=4) / n
    assert torch.allclose(frequencies, p, atol=0.005)
    expected_acceptance = torch.minimum(p, q).sum()  # P(accept) = sum min(p, q)
    assert abs(accepted.float().mean() - expected_acceptance) < 0.005
    assert next_q is p_batch  # the next round proposes from this round's target


def test_greedy_round_replaces_a_wrong_draft_by_the_target_argmax():
    q = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    p = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])
    tokens, _, accepted = verify_round(torch.tensor([[0, 1]]), q, p)
    assert tokens.tolist() == [[0, 2]]
    assert accepted.tolist() == [[True, False]]


def test_sample_draws_each_code_with_its_probability_and_never_an_impossible_one():
    probs = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])
    codes = sample(probs.expand(200_000, -1), torch.Generator().manual_seed(0))
    frequencies = torch.bincount(codes, minlength=6).float() / codes.numel()
    assert frequencies[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(frequencies, probs, atol=0.005, rtol=0)


def test_sample_draws_from_the_generator_in_order():
    probs = torch.full((4, 3, 8), 1 / 8)
    first = sample(probs, torch.Generator().manual_seed(5))
    assert torch.equal(first, sample(probs, torch.Generator().manual_seed(5)))
    assert not torch.equal(first, sample(probs, torch.Generator().manual_seed(6)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("decoding", ["ar", "ssd", "exact"])
def test_a_cpu_generator_drives_a_cuda_pipeline(decoding):
    """Noise is drawn on the generator's device and moved, as diffusers' randn_tensor does."""
    pipe = tiny_pipeline().to("cuda")
    out = pipe("a red circle", decoding=decoding, generator=torch.Generator().manual_seed(0), output_type="latent")
    assert out.codes.device.type == "cuda" and (out.codes >= 0).all() and not out.interrupted


def test_reweighting_moves_p_by_the_drafters_ratio_and_never_outside_its_support():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q_old = torch.tensor([0.5, 0.25, 0.25, 0.0])
    q_new = torch.tensor([0.25, 0.5, 0.0, 0.25])  # a top-k cut moved: code 2 ruled out, code 3 let in
    moved = reweighted(p, q_old, q_new, 2.0)
    weights = torch.tensor([0.5 * 0.25, 0.3 * 4, 0.2, 0.0])  # (1/2)^2, 2^2; a ruled-out code keeps its p
    torch.testing.assert_close(moved, weights / weights.sum())
    torch.testing.assert_close(reweighted(p, q_old, q_new, 0.0), p)
    before, after = torch.tensor([0.5, 1e-30, 0.5, 0.0]), torch.tensor([0.5, 0.5, 1e-30, 0.0])
    extreme = reweighted(p, before, after, 2.0)  # ratios of 5e29 squared: beyond float32, not beyond its logs
    assert torch.isfinite(extreme).all() and extreme[1] > 0.99


@pytest.mark.parametrize("per_image", [False, True], ids=["one-generator", "per-image"])
def test_a_noise_tape_holds_what_drawing_step_by_step_gives(per_image):
    """70 steps (past two pieces of 32) of [3, 5] noise: the tape's rows are the draws of `uniform` step by step,
    so a decoding that moves to the tape keeps its codes for its seeds."""

    def source():
        if per_image:
            return ImageGenerators([torch.Generator().manual_seed(s) for s in (4, 5, 6)])
        return torch.Generator().manual_seed(4)

    tape, stepwise = NoiseTape(source(), 3, 5, torch.device("cpu")), source()
    for _ in range(70):
        assert torch.equal(tape.next(), uniform((3, 5), stepwise, torch.device("cpu")))


def test_a_noise_tape_row_of_an_image_does_not_depend_on_its_batch():
    alone = NoiseTape(ImageGenerators([torch.Generator().manual_seed(9)]), 1, 4, torch.device("cpu"))
    seeds = (1, 9, 2)
    batch = NoiseTape(ImageGenerators([torch.Generator().manual_seed(s) for s in seeds]), 3, 4, torch.device("cpu"))
    for _ in range(40):
        assert torch.equal(batch.next()[1], alone.next()[0])


@pytest.mark.parametrize("top_k, top_p", [(1, None), (5, None), (50, None), (None, 0.3), (None, 0.9), (5, 0.95)])
def test_top_k_and_top_p_on_tensor_settings_equal_transformers_warpers_bit_for_bit(top_k, top_p):
    """`target_probs` reads its settings as tensors (so compiled graphs never recompile for a new value): its
    filters must be transformers' TopKLogitsWarper and TopPLogitsWarper exactly, ties included."""
    from transformers import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

    generator = torch.Generator().manual_seed(0)
    for scale in (1.0, 3.0):
        for temperature in (0.37, 1.0, 1.3):
            logits = torch.randn(4, 3, 64, generator=generator) * 4
            logits[0] = logits[0].round()  # ties at the k-th value and in the cumulative sums
            config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, guidance_scale=scale)
            guided = logits.float()
            if scale > 1:
                cond, uncond = guided.chunk(2)
                guided = uncond + scale * (cond - uncond)
            warpers = LogitsProcessorList(
                ([TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p else [])
            )
            tempered = guided / temperature
            expected = warpers(None, tempered.reshape(-1, 64)).reshape(tempered.shape).softmax(-1)
            assert torch.equal(target_probs(logits, config), expected), (scale, temperature)
