"""`GenerationRequest`: what one call of the pipeline asks for, built and checked once.

`pipe(...)` and the server build one from a call's arguments (`GenerationRequest.build`), which refuses everything
that can be judged without the model, with a message that says what to change; the pipeline then checks it against
its components (`SSDAutoregressivePipeline.check_inputs`: heads, VQ decoder, the image size and the window on it),
and, once the prompts are tokenized, the memory the batch needs. The decoding's options travel as one mapping: each
is declared once, by its strategy (`decoding/options.py`), and named only in `pipe(...)`'s signature.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from .decoding import DEFAULT_DECODING, check_options, options_for
from .sampling import RandomSource, random_source
from .sampling_config import SamplingConfig

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


@dataclass(frozen=True)
class GenerationRequest:
    """One call's inputs, checked. `options`: the options the decoding takes that the caller gave (not None);
    `guidance_scale` None: the backbone's own default (`sampling_for`)."""

    prompts: tuple[str, ...]
    negative_prompts: tuple[str, ...] | None = None
    num_images_per_prompt: int = 1
    height: int | None = None
    width: int | None = None
    guidance_scale: float | None = None
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    decoding: str = DEFAULT_DECODING
    options: dict = field(default_factory=dict)
    generator: RandomSource = None
    output_type: str = "pil"

    @classmethod
    def build(
        cls,
        prompt,
        negative_prompt=None,
        num_images_per_prompt=1,
        height=None,
        width=None,
        guidance_scale=None,
        temperature=1.0,
        top_k=None,
        top_p=None,
        generator=None,
        decoding: str = DEFAULT_DECODING,
        output_type: str = "pil",
        **options,
    ) -> GenerationRequest:
        """A request from `pipe(...)`'s arguments, or a ValueError that says what to pass instead."""
        prompts = _as_prompt_list(prompt)
        if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
            raise ValueError(
                f"`prompt` must be a non-empty string or a list of them, got {prompt!r}: describe the image."
            )
        negatives = None if negative_prompt is None else _as_prompt_list(negative_prompt)
        if negatives is not None:
            if not all(isinstance(n, str) for n in negatives):
                raise ValueError(f"`negative_prompt` must be a string or a list of strings, got {negative_prompt!r}.")
            if len(negatives) != len(prompts):
                raise ValueError(
                    f"got {len(negatives)} negative prompts for {len(prompts)} prompts: pass one per prompt."
                )
        _check_integer("num_images_per_prompt", num_images_per_prompt, minimum=1)
        for name, value in (("height", height), ("width", width)):
            if value is not None:
                _check_integer(name, value, minimum=1, hint="or None for the model's own size")
        counted = f"len(prompt) * num_images_per_prompt = {len(prompts)} * {num_images_per_prompt}"
        generator = random_source(generator, len(prompts) * num_images_per_prompt, counted)
        check_options(decoding, **options)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"unknown output_type {output_type!r}: choose one of {', '.join(OUTPUT_TYPES)}.")
        request = cls(
            prompts=tuple(prompts),
            negative_prompts=None if negatives is None else tuple(negatives),
            num_images_per_prompt=int(num_images_per_prompt),
            height=height,
            width=width,
            guidance_scale=guidance_scale,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            decoding=decoding,
            options=options_for(decoding, **options),
            generator=generator,
            output_type=output_type,
        )
        request.sampling_for(default_guidance_scale=1.0)  # the sampling settings' own checks, before any work
        return request

    @property
    def num_images(self) -> int:
        """len(prompts) * num_images_per_prompt: the images the call draws."""
        return len(self.prompts) * self.num_images_per_prompt

    def sampling_for(self, default_guidance_scale: float) -> SamplingConfig:
        """The sampling settings, the backbone's guidance scale where the caller left it None."""
        guidance = default_guidance_scale if self.guidance_scale is None else self.guidance_scale
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, guidance_scale=guidance)


def _as_prompt_list(prompt) -> list:
    return [prompt] if isinstance(prompt, str) else list(prompt) if isinstance(prompt, (list, tuple)) else [prompt]


def _check_integer(name: str, value, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}{' ' + hint if hint else ''}, got {value!r}.")
