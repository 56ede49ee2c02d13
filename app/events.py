"""What Generate and Stop do: pipeline runs turned into updates of the page.

`generate` yields dicts keyed by the names in OUTPUTS; `ui` maps the names to
its components. Bad input reaches the page as the pipeline's own message: values
are handed on unconverted (an API's 2.7 is refused, not truncated to 2), except
that a float with an integer value, as Gradio's sliders send, becomes that int.
"""

from __future__ import annotations

import secrets
from collections.abc import Generator, Iterator

import gradio as gr

from ssd_pipelines import SSDPipelineOutput
from ssd_pipelines.acceptance import acceptance_map
from ssd_pipelines.decoding import DEFAULT_DECODING, USER_DECODINGS, decoding_label, option_default
from ssd_pipelines.seeds import check_seed

from . import render
from .runner import Finished, Settings, StopFlags, stream

OUTPUTS = ("seed", "preview", "status", "images", "maps", "plot", "stats", "ar_images", "comparison")
# The page's seeds: its Seed box's maximum and the range random seeds are drawn from, a subset of `check_seed`'s (short
# to copy, and exact in a browser, whose numbers are exact only up to 2**53). A call's seed is checked by `check_seed`.
MAX_SEED = 2**32 - 1


def whole(value):
    """2.0 -> 2 (a slider's integer); anything else as it is, for the pipeline's check to accept or refuse."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


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
        guidance_scale: float | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        decoding: str = DEFAULT_DECODING,
        verify_rounds: int = option_default("ssd", "verify_rounds"),
        vertical_rows: int = option_default("ssd", "vertical_rows"),
        compare: bool = False,
        request: gr.Request | None = None,
    ) -> Iterator[dict]:
        """Decode the prompt (and with `compare`, the same prompt and seed with ar), streaming rows as they land.

        guidance_scale None: the model's own default. top_k None or 0: no top-k filter."""
        cleared = dict.fromkeys(OUTPUTS) | {"plot": gr.update(value=None, visible=False), "stats": "", "comparison": ""}
        if compare and decoding == "ar":
            others = ", ".join(d for d in USER_DECODINGS if d != "ar")
            message = f"Compare with AR decodes ar beside another decoding: choose decoding {others}."
            yield from self._refuse(cleared, message)
        seed = secrets.randbelow(MAX_SEED + 1) if random_seed else whole(seed or 0)  # 0: an emptied Seed box
        try:
            check_seed(seed, name="Seed")  # the batch draws from one generator seeded `seed`: one seed to check
        except ValueError as error:
            yield from self._refuse(cleared, str(error))
        settings = Settings(
            prompt=prompt,
            negative_prompt=negative_prompt,
            seed=seed,
            num_images=whole(num_images),
            guidance_scale=guidance_scale,
            temperature=temperature,
            top_k=whole(top_k),
            decoding=decoding,
            verify_rounds=whole(verify_rounds),
            vertical_rows=whole(vertical_rows),
        )
        yield cleared | {"seed": settings.seed, "status": f"{decoding}: starting"}
        with self.stops.track(request.session_hash if request else "") as stop:
            output = yield from self._run(settings, decoding, stop, cleared)
            for warning in output.warnings:  # also in the status: an API client sees no toast
                gr.Warning(warning, title="Prompt changed")
            notes = "".join(f"\n\n**Prompt changed:** {warning}" for warning in output.warnings)
            label = decoding_label(output.stats)  # "auto (exact)": what decoded
            last_round = output.stats["round_cap"]  # exact: rounds until nothing changes, no cap
            # Every output in the last update: an API client gets only that one.
            result = {
                "seed": settings.seed,
                "preview": render.tile(output.images),
                "status": self._summary(output) + notes,
                "images": [(image, f"{label} {i + 1}") for i, image in enumerate(output.images)],
                "maps": render.tile(
                    [acceptance_map(im, output.final_round[i], last_round) for i, im in enumerate(output.images)]
                ),
                "plot": gr.update(
                    value=render.acceptance_table(output.stats),
                    sort=render.round_order(output.stats),
                    visible=bool(output.stats["drafted_per_round"]),
                ),
                "stats": render.stats_markdown({label: output.stats}),
                "ar_images": None,
                "comparison": "",
            }
            yield result
            if not compare or output.interrupted:
                return
            baseline = yield from self._run(settings, "ar", stop, cleared)
            yield result | {
                "status": f"{self._summary(output)}; {self._summary(baseline)}{notes}",
                "ar_images": [(image, f"ar {i + 1}") for i, image in enumerate(baseline.images)],
                "stats": render.stats_markdown({label: output.stats, "ar": baseline.stats}),
                "comparison": "" if baseline.interrupted else render.speedup_markdown(output.stats, baseline.stats),
            }

    def stop(self, request: gr.Request) -> None:
        """Ask this session's running generation to stop after its current row."""
        self.stops.stop(request.session_hash)

    @staticmethod
    def _refuse(cleared: dict, message: str) -> Iterator[dict]:
        """Clear the last run's results, say why nothing was drawn, and fail the event (an API client gets the
        message as its error)."""
        yield cleared | {"seed": gr.skip(), "status": f"**Not generated:** {message}"}
        raise gr.Error(message, title="Not generated", print_exception=False)

    def _run(self, settings: Settings, decoding: str, stop, cleared: dict) -> Generator[dict, None, SSDPipelineOutput]:
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
            yield from self._refuse(cleared, str(error))

    def _summary(self, output: SSDPipelineOutput) -> str:
        stats = output.stats
        if output.interrupted:
            return f"{decoding_label(stats)}: stopped after {output.rows_completed} of {self.rows} rows"
        return (
            f"{decoding_label(stats)}: done, {self.rows} rows in {stats['forward_passes']} forward passes "
            f"({stats['seconds']:.2f} s)"
        )
