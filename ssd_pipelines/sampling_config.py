"""How a call samples its codes, declared and checked without torch: the CLI, the server and the demo build and
check a `SamplingConfig` before the model's libraries load, and `sampling.py` does the maths it describes."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

# Past this, guidance no longer changes what is drawn: on the reference model 98.8% of cells put >= 0.99 of their
# guided probability on one code at 10,000 (docs/decoding.md, "Guidance"), and a scale of 1e308 overflows to NaN.
MAX_GUIDANCE_SCALE = 10_000.0


@dataclass(frozen=True)
class SamplingConfig:
    """How a cell's token is drawn from the backbone's image-codebook logits (`sampling.target_probs` does it).

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_k / top_p: keep the k most likely codes / the smallest set of codes whose
        probability reaches p. None keeps everything.
    guidance_scale: classifier-free guidance weight, from 1 to `MAX_GUIDANCE_SCALE`; > 1 runs a conditional and an
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
        if not 1.0 <= self.guidance_scale <= MAX_GUIDANCE_SCALE:
            raise ValueError(
                f"guidance_scale must lie in [1, {MAX_GUIDANCE_SCALE:g}] (1 disables classifier-free guidance; past "
                f"{MAX_GUIDANCE_SCALE:g} each cell already takes its likeliest code, so it no longer changes the "
                f"image), got {self.guidance_scale}."
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_guidance(self) -> bool:
        """Whether the batch carries an unconditional branch behind the conditional one."""
        return self.guidance_scale > 1.0
