"""One generation request: its JSON body (a pydantic model) and its validation against the pipeline, into a `Job`.

Validation runs before a request joins a batch, with the pipeline's own checks (`GenerationRequest.build`, then
`pipe.check_inputs`), so a bad request is refused with the pipeline's `ValueError` text and never fails a batch of
good ones. The decoding options a body may carry are read from the strategies' declarations
(`ssd_pipelines.decoding`), not from a table kept here. Numbers are passed on as the client sent them, so that
the pipeline refuses `num_images=2.5` instead of the server truncating it. A prompt longer than the model reads is
refused by `check_inputs` before it is tokenized; a body larger than any readable request (`max_body_bytes`), by
the gateway before it is read whole.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, create_model

from ..decoding.catalog import DECODINGS, DEFAULT_DECODING, decoding_options, options_for
from ..request import GenerationRequest
from ..seeds import MAX_SEED, check_seed

Number = StrictInt | StrictFloat  # kept as sent: ints stay ints, 2.5 stays 2.5 for the pipeline to refuse


class _RequestFields(BaseModel):
    """The fields every request has; the decoding options are added from the declarations below."""

    model_config = ConfigDict(extra="forbid")  # a misspelt option is refused, not silently ignored

    prompt: StrictStr = Field(description="what to draw")
    negative_prompt: StrictStr | None = Field(None, description="what guidance steers away from")
    seed: StrictInt = Field(
        0, ge=0, le=MAX_SEED, description="image j is drawn from the seed + j (ssd_pipelines.seeds)"
    )
    num_images: Number | None = Field(None, description="images for the prompt (default 1)")
    num_images_per_prompt: Number | None = Field(None, description="the pipeline's name for num_images")
    decoding: StrictStr = Field(DEFAULT_DECODING, description="a strategy of ssd_pipelines.decoding (GET /info)")
    guidance_scale: Number | None = Field(None, description="classifier-free guidance; default: the model's own")
    temperature: Number = Field(1.0, description="0 is greedy")
    top_k: Number | None = None
    top_p: Number | None = None
    height: Number | None = Field(None, description="default: the model's own size")
    width: Number | None = None
    response: Literal["png", "json"] = Field(
        "json", description="png: the image itself (one image only); json: base64 PNGs, codes, stats, warnings"
    )


GenerateRequest = create_model(
    "GenerateRequest",
    __base__=_RequestFields,
    __module__=__name__,
    __doc__="The JSON body of POST /generate.",
    **{
        name: (Number | None, Field(None, description=f"decoding option: {option.about} (default {option.default})"))
        for name, (option, _) in decoding_options().items()
    },
)


PROMPTS = ("prompt", "negative_prompt")


def max_body_bytes(prompt_chars: int) -> int:
    """The largest body a readable request can have (`prompt_chars`: the pipeline's `max_prompt_chars`), measured
    on the largest one: both prompts at `prompt_chars` characters that JSON escapes at the greatest length (a
    surrogate pair, 12 bytes), every other field at the longest JSON number, indented."""
    largest = {name: -sys.float_info.max for name in GenerateRequest.model_fields}
    largest |= {name: chr(sys.maxunicode) * prompt_chars for name in PROMPTS}
    return len(json.dumps(largest, indent=2).encode())


@dataclass(frozen=True)
class Limits:
    """What one server accepts beyond the pipeline's own checks."""

    max_images_per_request: int = 8


@dataclass
class Job:
    """A validated request, as the batcher runs it. `group` is what requests must share to run in one call."""

    prompt: str
    negative_prompt: str | None
    seed: int
    num_images: int
    decoding: str
    options: dict  # the decoding's options, defaults filled in where the strategy declares one
    sampling: dict  # guidance_scale (resolved), temperature, top_k, top_p
    height: int | None
    width: int | None
    grid: tuple[int, int]
    response: str
    warnings: list[str]  # what the pipeline changed in this request's own prompt
    received: float = field(default_factory=time.perf_counter)

    @property
    def group(self) -> tuple:
        return (
            self.decoding,
            tuple(sorted(self.options.items())),
            tuple(sorted(self.sampling.items())),
            self.grid,
            self.negative_prompt is None,
        )

    def call_options(self) -> dict:
        """What `pipe(...)` takes besides prompts and generators, for this job or any job of its group."""
        return {
            "decoding": self.decoding,
            **self.options,
            **self.sampling,
            "height": self.height,
            "width": self.width,
            "output_type": "pil",
        }

    def seeds(self) -> list[int]:
        return [self.seed + j for j in range(self.num_images)]


def generators(seeds: list[int]) -> list[torch.Generator]:
    """One CPU generator per image (the same seed gives the same codes on any device)."""
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def prepare(pipe, request: _RequestFields, limits: Limits = Limits(), option_defaults: dict | None = None) -> Job:
    """Check a request as the pipeline would; a ValueError carries the pipeline's message. `option_defaults`:
    the server's own defaults of decoding options (its measured `exact_max_batch`), for a request that leaves
    them out and whose decoding takes them."""
    values = request.model_dump()
    options = {name: values[name] for name in decoding_options()}
    takes = DECODINGS[request.decoding].option_names() if request.decoding in DECODINGS else ()
    for name, value in (option_defaults or {}).items():
        if options.get(name) is None and name in takes:
            options[name] = value
    num_images = _num_images(values["num_images"], values["num_images_per_prompt"])
    call = GenerationRequest.build(
        request.prompt,
        request.negative_prompt,
        num_images,
        request.height,
        request.width,
        request.guidance_scale,
        request.temperature,
        request.top_k,
        request.top_p,
        decoding=request.decoding,
        **options,
    )
    grid = pipe.check_inputs(call)
    check_seed(request.seed, count=num_images)
    if num_images > limits.max_images_per_request:
        raise ValueError(
            f"num_images={num_images}: this server draws at most {limits.max_images_per_request} images a request; "
            "send several requests."
        )
    if request.response == "png" and num_images != 1:
        raise ValueError(
            f"response='png' returns one image and num_images={num_images}: ask response='json' for all of them "
            "(base64 PNGs), or num_images=1."
        )
    backbone = pipe.image_backbone
    sampling = call.sampling_for(backbone.default_guidance_scale)
    negatives = None if request.negative_prompt is None else [request.negative_prompt]
    batch = backbone.encode_prompts([request.prompt], negatives, 1, guidance=sampling.uses_guidance, grid=grid)
    return Job(
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        seed=request.seed,
        num_images=num_images,
        decoding=request.decoding,
        options=_with_defaults(request.decoding, options),
        sampling={
            "guidance_scale": sampling.guidance_scale,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
        },
        height=request.height,
        width=request.width,
        grid=(grid.rows, grid.cols),
        response=request.response,
        warnings=list(batch.notes),
    )


def _num_images(num_images, num_images_per_prompt):
    if num_images is not None and num_images_per_prompt is not None and num_images != num_images_per_prompt:
        raise ValueError(
            f"num_images={num_images!r} and num_images_per_prompt={num_images_per_prompt!r} disagree: pass one."
        )
    chosen = num_images if num_images is not None else num_images_per_prompt
    return 1 if chosen is None else chosen


def _with_defaults(decoding: str, options: dict) -> dict:
    """The options `decoding` takes, each default filled in (the strategy uses it for None anyway), so that
    requests that leave an option out and requests that pass its default share a call."""
    chosen = options_for(decoding, **options)
    for option in DECODINGS[decoding].options:
        if option.name not in chosen and option.default is not None:
            chosen[option.name] = option.default
    return chosen
