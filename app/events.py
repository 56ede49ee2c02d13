"""What Generate and Stop do: pipeline runs turned into updates of the page.

`generate` yields dicts keyed by the names in OUTPUTS; `ui` maps the names to
its components. Bad input reaches the page as the pipeline's own message.
"""

from __future__ import annotations

import secrets
from collections.abc import Generator, Iterator

import gradio as gr

from ssd_pipelines import SSDPipelineOutput

from . import render
from .runner import Finished, Settings, StopFlags, stream

OUTPUTS = ("seed", "preview", "status", "images", "maps", "plot", "stats", "ar_images", "comparison")
MAX_SEED = 2**32 - 1


class DemoEvents:
    """The event handlers over one shared pipeline (loaded once, called from Gradio's worker threads)."""

    def __init__(self, pipe) -> None:
        self.pipe = pipe
        self.rows = pipe.image_backbone.grid.rows
        self.stops = StopFlags()

    def generate(
        self,
        prompt: str,
        negative_prompt: str = "",
        seed: int = 0,
        random_seed: bool = False,
        num_images: int = 1,
        guidance_scale: float = 3.0,
        temperature: float = 1.0,
        top_k: int = 0,
        decoding: str = "ssd",
        verify_rounds: int = 2,
        vertical_rows: int = 1,
        compare: bool = False,
        request: gr.Request | None = None,
    ) -> Iterator[dict]:
        """Decode the prompt (and with `compare`, the same prompt and seed with ar), streaming rows as they land."""
        if compare and decoding == "ar":
            raise gr.Error("Compare with AR decodes ar beside ssd or exact: choose decoding ssd or exact.")
        if random_seed:
            seed = secrets.randbelow(MAX_SEED + 1)
        settings = Settings(
            prompt=prompt,
            negative_prompt=negative_prompt,
            seed=int(seed or 0),  # an emptied Seed box
            num_images=int(num_images),
            guidance_scale=float(guidance_scale),
            temperature=float(temperature),
            top_k=int(top_k),
            decoding=decoding,
            verify_rounds=int(verify_rounds),
            vertical_rows=int(vertical_rows),
        )
        yield dict.fromkeys(OUTPUTS) | {
            "seed": settings.seed,
            "status": f"{decoding}: starting",
            "plot": gr.update(value=None, visible=False),
            "stats": "",
            "comparison": "",
        }
        with self.stops.track(request.session_hash if request else "") as stop:
            output = yield from self._run(settings, decoding, stop)
            last_round = settings.verify_rounds if decoding == "ssd" else None  # exact: rounds until no change
            # Every output in the last update: an API client gets only that one.
            result = {
                "seed": settings.seed,
                "preview": render.tile(output.images),
                "status": self._summary(output),
                "images": [(image, f"{decoding} {i + 1}") for i, image in enumerate(output.images)],
                "maps": render.tile(
                    [render.acceptance_map(im, output.final_round[i], last_round) for i, im in enumerate(output.images)]
                ),
                "plot": gr.update(
                    value=render.acceptance_table(output.stats), visible=bool(output.stats["drafted_per_round"])
                ),
                "stats": render.stats_markdown({decoding: output.stats}),
                "ar_images": None,
                "comparison": "",
            }
            yield result
            if not compare or output.interrupted:
                return
            baseline = yield from self._run(settings, "ar", stop)
            yield result | {
                "status": f"{self._summary(output)}; {self._summary(baseline)}",
                "ar_images": [(image, f"ar {i + 1}") for i, image in enumerate(baseline.images)],
                "stats": render.stats_markdown({decoding: output.stats, "ar": baseline.stats}),
                "comparison": "" if baseline.interrupted else render.speedup_markdown(output.stats, baseline.stats),
            }

    def stop(self, request: gr.Request) -> None:
        """Ask this session's running generation to stop after its current row."""
        self.stops.stop(request.session_hash)

    def _run(self, settings: Settings, decoding: str, stop) -> Generator[dict, None, SSDPipelineOutput]:
        """One pipeline call; yields preview updates, returns the pipeline's output."""
        try:
            for event in stream(self.pipe, settings.pipeline_kwargs(decoding), stop):
                if isinstance(event, Finished):
                    return event.output
                yield {
                    "preview": render.tile(self.pipe.decode_codes(event.codes, output_type="pil")),
                    "status": f"{decoding}: {event.rows} of {self.rows} rows decoded",
                }
        except ValueError as error:  # the pipeline's check of the inputs: its message says what to change
            yield {"status": f"Not generated: {error}"}  # stays on the page after the toast
            raise gr.Error(str(error)) from error

    def _summary(self, output: SSDPipelineOutput) -> str:
        stats = output.stats
        if output.interrupted:
            return f"{stats['strategy']}: stopped after {output.rows_completed} of {self.rows} rows"
        return (
            f"{stats['strategy']}: done, {self.rows} rows in {stats['forward_passes']} forward passes "
            f"({stats['seconds']:.2f} s)"
        )
