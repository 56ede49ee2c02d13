"""One sampling path for every decoding strategy, and the maths of verification.

Every strategy turns image-codebook logits into a distribution through
`target_probs` (guidance, temperature, top-k, top-p), so a draft and the target
it is checked against are always processed the same way. Greedy decoding is the
limit of zero temperature: the distribution is one-hot on the argmax, and the
speculative acceptance rule then reproduces the greedy token exactly.

Randomness comes only from the caller's `torch.Generator`, drawn on the
generator's own device and moved to the model's (as diffusers' `randn_tensor`
does), so a CPU generator drives a CUDA model and gives it the same codes.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper


@dataclass(frozen=True)
class SamplingConfig:
    """How a cell's token is drawn from the backbone's image-codebook logits.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_k / top_p: keep the k most likely codes / the smallest set of codes whose
        probability reaches p. None keeps everything.
    guidance_scale: classifier-free guidance weight; > 1 runs a conditional and an
        unconditional branch in one batch, 1 runs the conditional branch alone.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    guidance_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("temperature", "guidance_scale", "top_p"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise ValueError(f"{name} must be a number, got {value!r}.")
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}: pass a real value.")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral)):
            raise ValueError(f"top_k must be a positive integer or None to disable it, got {self.top_k!r}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be a positive integer or None to disable it, got {self.top_k}.")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1] (1 or None disables it), got {self.top_p}.")
        if self.guidance_scale < 1.0:
            raise ValueError(
                f"guidance_scale must be >= 1 (1 disables classifier-free guidance), got {self.guidance_scale}."
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_guidance(self) -> bool:
        """Whether the batch carries an unconditional branch behind the conditional one."""
        return self.guidance_scale > 1.0

    def warpers(self) -> LogitsProcessorList:
        """transformers' warpers for top-k and top-p, applied after guidance and temperature."""
        warpers = LogitsProcessorList()
        if self.top_k is not None:
            warpers.append(TopKLogitsWarper(self.top_k))
        if self.top_p is not None and self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(self.top_p))
        return warpers


def target_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Image-codebook logits -> the distribution tokens are sampled from.

    logits: [B', ..., K] where B' = 2B with guidance (conditional rows first,
    then unconditional), else B. Returns float32 probabilities [B, ..., K].
    """
    if config.greedy:
        guided = _guided(logits, config)
        return torch.zeros_like(guided).scatter_(-1, guided.argmax(-1, keepdim=True), 1.0)
    return _processed(logits, config).softmax(-1)


def target_log_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The log of `target_probs`, computed stably: what a loss on the verifier's own distribution needs.
    Greedy has no log-density (one-hot): train with a temperature."""
    if config.greedy:
        raise ValueError("a greedy target has no log-probabilities: pass a temperature > 0.")
    return _processed(logits, config).log_softmax(-1)


def _guided(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    logits = logits.float()
    if config.uses_guidance:
        cond, uncond = logits.chunk(2, dim=0)
        logits = uncond + config.guidance_scale * (cond - uncond)
    return logits


def _processed(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Guided, tempered and warped logits (top-k / top-p leave -inf), before the softmax."""
    logits = _guided(logits, config) / config.temperature
    warpers = config.warpers()
    if warpers:
        flat = logits.reshape(-1, logits.shape[-1])  # [N, K]: the warpers work on 2-D scores
        logits = warpers(None, flat).reshape(logits.shape)
    return logits


def uniform(
    shape: torch.Size | tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """U[0, 1) noise of `shape` on `device`, drawn on the generator's device."""
    source = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=source).to(device)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one code per distribution by inverting its CDF. probs: [..., K] -> codes [...]."""
    cdf = probs.cumsum(-1)  # [..., K]
    u = uniform(probs.shape[:-1], generator, probs.device)[..., None] * cdf[..., -1:]  # [..., 1]
    # The first code whose CDF exceeds u: codes of zero probability never are (their CDF equals the previous
    # one). Should rounding put u at the CDF's end, the last code of positive probability is taken.
    last_possible = (probs > 0).long().cumsum(-1).argmax(-1, keepdim=True)  # [..., 1]
    return torch.minimum(torch.searchsorted(cdf, u, right=True), last_possible).squeeze(-1)


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
    generator: torch.Generator | None = None,
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
    """
    p_token = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
    q_token = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, N]
    u = uniform(tokens.shape, generator, tokens.device)
    accepted = u * q_token < p_token  # u < p/q without dividing by a zero q
    resampled = sample(residual(p, q), generator)
    return torch.where(accepted, tokens, resampled), p, accepted
