"""One sampling path for every decoding strategy, and the maths of verification.

Every strategy turns image-codebook logits into a distribution through
`target_probs` (guidance, temperature, top-k, top-p), so a draft and the target
it is checked against are always processed the same way. Greedy decoding is the
limit of zero temperature: the distribution is one-hot on the argmax, and the
speculative acceptance rule then reproduces the greedy token exactly.

Randomness comes only from the caller's source: one `torch.Generator` that the
whole batch draws from in order, or `ImageGenerators`, one generator per image,
so that an image's codes do not depend on what it is batched with. Noise is
drawn on the generator's own device and moved to the model's (as diffusers'
`randn_tensor` does), so a CPU generator drives a CUDA model and gives it the
same codes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .sampling_config import SamplingConfig


@dataclass(frozen=True)
class SamplingTensors:
    """A call's `SamplingConfig` as compiled graphs read it: the values (guidance scale, temperature, top-k, top-p)
    are 0-d tensors on the model's device, inputs of the graphs, so that a call with other values replays the same
    graphs (a Python float is a constant dynamo guards on: the ninth guidance scale ran eagerly, issue 51). What
    changes the computation itself stays Python: greedy or not, guided or not, top-k and top-p on or off."""

    greedy: bool
    guidance: bool
    scale: torch.Tensor  # float32
    temperature: torch.Tensor  # float32; 1 when greedy (unused)
    top_k: torch.Tensor | None  # long; None: off
    top_p_floor: torch.Tensor | None  # float32 1 - top_p, taken in double as transformers does; None: off

    @classmethod
    def of(cls, config: SamplingConfig, device: torch.device) -> SamplingTensors:
        """One host-to-device copy a call."""
        top_p = config.top_p is not None and config.top_p < 1.0
        values = torch.tensor(
            [config.guidance_scale, config.temperature or 1.0, 1 - config.top_p if top_p else 0.0], device=device
        )
        top_k = None if config.top_k is None else torch.tensor(config.top_k, device=device)
        return cls(config.greedy, config.uses_guidance, values[0], values[1], top_k, values[2] if top_p else None)


def target_probs(logits: torch.Tensor, config: SamplingConfig | SamplingTensors) -> torch.Tensor:
    """Image-codebook logits -> the distribution tokens are sampled from.

    logits: [B', ..., K] where B' = 2B with guidance (conditional rows first,
    then unconditional), else B. Returns float32 probabilities [B, ..., K].
    """
    config = _on_device(config, logits.device)
    if config.greedy:
        guided = _guided(logits, config)
        return torch.zeros_like(guided).scatter_(-1, guided.argmax(-1, keepdim=True), 1.0)
    return _processed(logits, config).softmax(-1)


def target_log_probs(logits: torch.Tensor, config: SamplingConfig | SamplingTensors) -> torch.Tensor:
    """The log of `target_probs`, computed stably: what a loss on the verifier's own distribution needs.
    Greedy has no log-density (one-hot): train with a temperature."""
    config = _on_device(config, logits.device)
    if config.greedy:
        raise ValueError("a greedy target has no log-probabilities: pass a temperature > 0.")
    return _processed(logits, config).log_softmax(-1)


def _on_device(config: SamplingConfig | SamplingTensors, device: torch.device) -> SamplingTensors:
    return config if isinstance(config, SamplingTensors) else SamplingTensors.of(config, device)


def _guided(logits: torch.Tensor, config: SamplingTensors) -> torch.Tensor:
    logits = logits.float()
    if config.guidance:
        cond, uncond = logits.chunk(2, dim=0)
        logits = uncond + config.scale * (cond - uncond)
    return logits


def _processed(logits: torch.Tensor, config: SamplingTensors) -> torch.Tensor:
    """Guided, tempered and warped logits (top-k, then top-p, leave -inf), before the softmax: transformers'
    `TopKLogitsWarper` and `TopPLogitsWarper`, written on tensor settings (theirs take Python numbers), equal to
    theirs bit for bit (tests/test_sampling.py)."""
    logits = _guided(logits, config) / config.temperature
    if config.top_k is not None:
        kth = logits.sort(dim=-1, descending=True).values.gather(
            -1, (config.top_k.clamp(max=logits.shape[-1]) - 1).expand(*logits.shape[:-1], 1)
        )
        logits = logits.masked_fill(logits < kth, -float("inf"))
    if config.top_p_floor is not None:  # the smallest set of likeliest codes whose probability reaches top_p
        ascending, order = logits.sort(dim=-1)
        outside = ascending.softmax(dim=-1).cumsum(dim=-1) <= config.top_p_floor
        outside[..., -1] = False  # the likeliest code always stays
        logits = logits.masked_fill(outside.scatter(-1, order, outside), -float("inf"))
    return logits


class ImageGenerators:
    """One `torch.Generator` per image of a batch: each image draws all of its randomness from its own, so that its
    codes depend on its own prompt, seed and options, not on what it is batched with (docs/decoding.md, "Seeds that
    do not depend on the batch").

    A draw of shape [n, ...] gives row i from the generator of image `images[i]` (by default row b is image b).
    Each image draws its rows in their order, in one `torch.rand` call of [its rows, ...] on its generator's device,
    so what it draws depends only on how many rows it has in each draw: on its own state, never on other images'.
    A row whose image is negative draws nothing and holds 0 (a strategy done with an image marks it so)."""

    def __init__(self, generators: Sequence[torch.Generator]):
        self.generators = tuple(generators)
        wrong = next((i for i, g in enumerate(self.generators) if not isinstance(g, torch.Generator)), None)
        if wrong is not None:  # a ValueError, as every other check of a call's inputs
            raise ValueError(
                f"`generator` must be a list of torch.Generators, one per image; item {wrong} is a "
                f"{type(self.generators[wrong]).__name__}: pass torch.Generator(device).manual_seed(seed) for each image."
            )

    def __len__(self) -> int:
        return len(self.generators)

    def rand(self, shape: torch.Size | tuple[int, ...], device: torch.device, images=None) -> torch.Tensor:
        """U[0, 1) noise of `shape` on `device`, row i from image images[i]'s generator (default: row b, image b).
        images: a tensor or sequence [shape[0]] of image indices; negative entries draw nothing (0)."""
        shape = tuple(shape)
        if images is None:
            if shape[0] != len(self.generators):
                raise ValueError(f"a draw of {shape[0]} rows from {len(self.generators)} per-image generators.")
            if not shape[0]:
                return torch.zeros(shape, device=device)
            return torch.cat([self._draw(g, (1, *shape[1:]), device) for g in self.generators])
        owners = images.tolist() if isinstance(images, torch.Tensor) else list(images)
        if len(owners) != shape[0]:
            raise ValueError(f"{len(owners)} image indices for a draw of {shape[0]} rows.")
        rows: dict[int, list[int]] = {}
        for row, image in enumerate(owners):
            if image >= 0:
                rows.setdefault(image, []).append(row)
        noise = torch.zeros(shape, device=device)
        if rows:
            order = [row for image in sorted(rows) for row in rows[image]]
            drawn = [
                self._draw(self.generators[image], (len(rows[image]), *shape[1:]), device) for image in sorted(rows)
            ]
            noise[torch.tensor(order, device=device)] = torch.cat(drawn)
        return noise

    def each(self, shape: tuple[int, ...]) -> torch.Tensor:
        """[B, *shape]: image b's draw of `shape` from its own generator, in one call each, on the first
        generator's device."""
        home = self.generators[0].device
        return torch.stack([self._draw(g, shape, home) for g in self.generators])

    @staticmethod
    def _draw(generator: torch.Generator, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        return to_device(torch.rand(shape, generator=generator, device=generator.device), device)


RandomSource = torch.Generator | ImageGenerators | None
"""Where a decoding's noise comes from: one generator for the batch, one per image, or torch's global one."""


def random_source(generator, batch_size: int, counted: str = "") -> RandomSource:
    """A caller's `generator` as a `RandomSource` for a batch of `batch_size` images: None, one torch.Generator, or
    one per image (a list or tuple of them, or `ImageGenerators`). A ValueError says what to pass otherwise;
    `counted` says how the caller's batch size comes about, e.g. "len(prompt) * num_images_per_prompt = 2 * 2"."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    listed = isinstance(generator, (list, tuple, ImageGenerators))
    if not listed or len(generator) != batch_size:
        got = f"a list of {len(generator)}" if listed else f"a {type(generator).__name__}"
        raise ValueError(
            f"`generator` must be one torch.Generator for the whole batch, or a list of {batch_size}"
            f"{f' ({counted})' if counted else ''}, one per image; got {got}."
        )
    return generator if isinstance(generator, ImageGenerators) else ImageGenerators(generator)


def uniform(
    shape: torch.Size | tuple[int, ...], generator: RandomSource, device: torch.device, images=None
) -> torch.Tensor:
    """U[0, 1) noise of `shape` on `device`, drawn on the generator's device.

    images: with `ImageGenerators`, which image each row of shape[0] belongs to (default: row b is image b; see
    `ImageGenerators.rand`); a single generator ignores it and draws the whole shape at once, in order."""
    if isinstance(generator, ImageGenerators):
        return generator.rand(shape, device, images)
    source = generator.device if generator is not None else device
    return to_device(torch.rand(shape, generator=generator, device=source), device)


def to_device(noise: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Noise drawn on a generator's device, moved to the model's without making the host wait: from a CPU
    generator to a GPU through pinned memory, a copy the GPU makes when it gets there."""
    device = torch.device(device)
    if noise.device.type == "cpu" and device.type == "cuda":
        noise = noise.pin_memory()
    # to the host a copy must wait for the data; on the same device `to` is the tensor itself
    return noise.to(device, non_blocking=device.type != "cpu" or noise.device.type == "cpu")


def sample(probs: torch.Tensor, generator: RandomSource = None, images=None) -> torch.Tensor:
    """Draw one code per distribution by inverting its CDF. probs: [..., K] -> codes [...].
    images: which image each row of probs belongs to, for `ImageGenerators` (see `uniform`)."""
    return sample_with(probs, uniform(probs.shape[:-1], generator, probs.device, images))


def sample_with(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """`sample` with its noise drawn beforehand: u [...] in [0, 1), one per distribution of probs [..., K]."""
    cdf = probs.cumsum(-1)  # [..., K]
    u = u[..., None] * cdf[..., -1:]  # [..., 1]
    # The first code whose CDF exceeds u: codes of zero probability never are (their CDF equals the previous
    # one). Should rounding put u at the CDF's end, the last code of positive probability is taken.
    last_possible = (probs > 0).long().cumsum(-1).argmax(-1, keepdim=True)  # [..., 1]
    return torch.minimum(torch.searchsorted(cdf, u.contiguous(), right=True), last_possible).squeeze(-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where a rejected draft is resampled from.

    When p == q nothing is ever rejected, but the tensor is still evaluated for
    every cell; p itself then stands in for the empty residual.
    """
    mass = (p - q).clamp_min(0)
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 0, mass / total.clamp_min(torch.finfo(p.dtype).tiny), p)


def verify_round(
    tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: RandomSource = None,
    images=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One auto-correcting verification round over drafted cells, all cells independently.

    tokens: [B, N] current codes, each a sample of q; q, p: [B, N, K] proposal and
    target. Every cell is accepted with probability min(1, p(t) / q(t)); a rejected
    cell is resampled from norm(max(0, p - q)). A rejection does not discard the
    cells to its right.

    Returns (tokens, next_q, accepted). Every returned token is a sample of this
    round's p at its cell (accepted or resampled alike), so the next round's
    proposal is p itself (docs/decoding.md, "Which q"). Keeping the head's q for accepted
    cells instead stops the rounds from converging to the AR distribution.

    images: which image each row of tokens belongs to, for `ImageGenerators` (see `uniform`): each image draws its
    acceptance noise, then its resampling noise.
    """
    accept_noise = uniform(tokens.shape, generator, tokens.device, images)
    return verify_with(tokens, q, p, accept_noise, uniform(tokens.shape, generator, tokens.device, images))


def verify_with(
    tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, accept_noise: torch.Tensor, resample_noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`verify_round` with its noise drawn beforehand, U[0, 1) of tokens' shape [B, N] each: what the engines call,
    so that a pass draws its noise in one piece (`NoiseTape`) and never waits on the host."""
    p_token = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
    q_token = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
    accepted = accept_noise * q_token < p_token  # u < p/q without dividing by a zero q
    resampled = sample_with(residual(p, q), resample_noise)
    return torch.where(accepted, tokens, resampled), p, accepted


class NoiseTape:
    """The noise of a decoding loop, drawn ahead in pieces: every step takes [B, width] uniforms, image b's from its
    own generator (or all from one), so what a step draws never depends on the data, and drawing never waits on
    the host (a CPU generator feeding a GPU copies once a piece, not once a step).

    The tape is what drawing step by step would give: image b's generator (or the one generator, batch-major)
    draws its steps' rows in order, `steps_ahead` of them at a time. So an image's codes still depend only on its
    own generator, and the steps a decoding takes decide how much of the tape it reads, not what is on it."""

    def __init__(
        self,
        generator: RandomSource,
        batch: int,
        width: int,
        device: torch.device,
        steps_ahead: int = 32,
        images: int | None = None,
    ):
        """images: the batch's real images, when it is padded to `batch` with clones of its last (`batch_buckets`):
        they draw as an unpadded batch would, and the clones repeat the last one's noise."""
        self.generator, self.batch, self.width, self.device = generator, batch, width, device
        self.steps_ahead = steps_ahead
        self.images = batch if images is None else images
        self.piece: torch.Tensor | None = None  # [steps_ahead, B, width]
        self.used = steps_ahead

    def next(self) -> torch.Tensor:
        """The next step's noise [B, width]."""
        if self.used == self.steps_ahead:
            self.piece = self._draw()
            self.used = 0
        self.used += 1
        return self.piece[self.used - 1]

    def _draw(self) -> torch.Tensor:
        if isinstance(self.generator, ImageGenerators):  # image b's steps in order, as drawn one by one
            noise = to_device(self.generator.each((self.steps_ahead, self.width)).transpose(0, 1), self.device)
        else:
            noise = uniform((self.steps_ahead, self.images, self.width), self.generator, self.device)
        return repeat_last_image(noise, self.batch, dim=1).contiguous()  # one layout: compiled steps guard on strides


def repeat_last_image(noise: torch.Tensor, images: int, dim: int = 0) -> torch.Tensor:
    """Noise of a batch's real images along `dim`, the last image's repeated up to `images` (a padded batch's clones
    draw what the image they clone draws, `batch_buckets`)."""
    extra = images - noise.shape[dim]
    if extra == 0:
        return noise
    last = noise.narrow(dim, noise.shape[dim] - 1, 1)
    return torch.cat([noise, last.expand(*(extra if d == dim else -1 for d in range(noise.dim())))], dim=dim)


def reweighted(p: torch.Tensor, q_old: torch.Tensor, q_new: torch.Tensor, power: float) -> torch.Tensor:
    """norm(p * (q_new / q_old) ** power): a target p moved as a drafter predicts it moves when its inputs change
    from those of q_old to those of q_new (power 0 is p itself). [..., K] -> [..., K].

    In log space, so that tiny q's cannot overflow; a code either q rules out (top-k, top-p) keeps its p, and the
    result never puts mass where p has none."""
    log_ratio = torch.where((q_old > 0) & (q_new > 0), q_new.log() - q_old.log(), 0.0)
    return torch.softmax(p.log() + power * log_ratio, dim=-1)
