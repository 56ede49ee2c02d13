"""The page: controls on the left, what the run drew and how on the right; every control says what it does."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr
import PIL.Image

from ssd_pipelines.decoding import DECODINGS, DEFAULT_DECODING, USER_DECODINGS
from ssd_pipelines.reference.captions import captions
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START

from . import render
from .events import MAX_SEED, DemoEvents

CSS = """
#preview img, #images img, #ar-images img, #maps img { image-rendering: pixelated; }
/* Gradio's image frame is as wide as its picture, and the picture 100% of the frame: when the frame is laid out
   before a new picture is decoded, that circle resolves to 0 px and the preview stays an empty strip (about 1 run
   in 3). A frame as wide as its box breaks the circle; the picture is scaled to fit, cells kept square. */
#preview .image-frame, #maps .image-frame { width: 100%; }
#preview .image-frame img, #maps .image-frame img { object-fit: contain; }
/* Generate runs with show_progress="hidden": the status line says how it went, and a failed run shows its toast
   once, without Gradio's "Error" badge over each output. */
[data-testid="status-tracker"].hidden { display: none !important; }
.legend { list-style: none; padding: 0; margin: 0; }
.legend li { margin: 0.2em 0; }
.legend .swatch { display: inline-block; width: 0.9em; height: 0.9em; border-radius: 2px; margin-right: 0.4em;
  vertical-align: -0.1em; }
"""

# Buttons take no info text in Gradio: their tooltips are set in the page.
BUTTON_TOOLTIPS = {
    "generate": "Decode the prompt; the preview fills in as rows are committed",
    "stop": "Stop this generation after the row being decoded (partial images are kept)",
}
JS = f"""() => {{
  for (const [id, text] of Object.entries({json.dumps(BUTTON_TOOLTIPS)})) {{
    const button = document.getElementById(id);
    if (button) button.title = text;
  }}
}}"""


def example_prompts(count: int = 8) -> list[str]:
    """Captions of held-out scenes of the reference model: prompts it can draw but never trained on. Shortest
    first, then alphabetical: the same list, and the same first prompt in the box, in every process."""
    return sorted(set(captions(count * 2, HELDOUT_SEED_START)), key=lambda text: (len(text), text))[:count]


def _as_files(value, folder: Path):
    """PIL images in an update (an image, a gallery's (image, caption) pairs) as PNG files (see `render.png_file`)."""
    if isinstance(value, PIL.Image.Image):
        return render.png_file(value, folder)
    if isinstance(value, list):
        return [(render.png_file(image, folder), caption) for image, caption in value]
    return value


def _bind(handler: Callable[..., Iterator[dict]], components: dict[str, gr.components.Component]):
    """Map the handler's updates, keyed by name, to the components (keeps the handler's signature for the API)."""

    @functools.wraps(handler)
    def run(*args, **kwargs):
        folder = Path(gr.utils.get_upload_folder()) / "ssd-demo"
        folder.mkdir(parents=True, exist_ok=True)
        for update in handler(*args, **kwargs):
            yield {components[name]: _as_files(value, folder) for name, value in update.items()}

    return run


def _decoding_changed(decoding: str):
    """Grey out the options a decoding does not take (the pipeline rejects them), as the decoding declares them."""
    takes = DECODINGS[decoding].option_names()
    return (
        gr.update(interactive="verify_rounds" in takes),
        gr.update(interactive="vertical_rows" in takes),
        gr.update(interactive=True) if decoding != "ar" else gr.update(interactive=False, value=False),
    )


def decoding_info() -> str:
    """What each decoding does, lossy or lossless, from the strategies' own summaries, and which to pick."""
    summaries = "; ".join(f"{d}: {DECODINGS[d].summary}" for d in USER_DECODINGS)
    lossless = " and ".join(d for d in USER_DECODINGS if DECODINGS[d].lossless)
    return (
        f"{summaries}. The default, {DEFAULT_DECODING}, is lossless; pick ssd for the fewest passes when images near "
        f"ar's are enough ({lossless} are lossless)."
    )


def _range_info(about: str, low, high) -> str:
    """An info text that gives the range: the page sets a typed value beyond it to the nearest end."""
    return f"{about} Range {low} to {high}; a typed value beyond it is set to the nearest end."


def _controls(grid, max_vertical: int, guidance: float) -> dict[str, gr.components.Component]:
    """The inputs of Generate, keyed by `DemoEvents.generate`'s parameter names, and the two buttons."""
    c = {}
    examples = example_prompts()
    c["prompt"] = gr.Textbox(
        label="Prompt",
        lines=2,
        value=examples[0],  # the first click draws something
        placeholder="Describe the image (see the examples below)",
        info="What to draw: shapes, colours, counts, positions. Enter or Generate starts.",
        elem_id="prompt",
    )
    c["negative_prompt"] = gr.Textbox(
        label="Negative prompt",
        value="",
        info="Guidance steers away from this (empty: the unconditional prompt).",
        elem_id="negative-prompt",
    )
    gr.Examples([[p] for p in examples], inputs=[c["prompt"]], label="Held-out captions (never trained on)")
    with gr.Row():
        c["seed"] = gr.Number(
            label="Seed",
            value=0,
            precision=0,
            minimum=0,
            maximum=MAX_SEED,
            info=f"Same seed, same images (0 to {MAX_SEED}). Shows the seed used.",
            elem_id="seed",
        )
        c["random_seed"] = gr.Checkbox(label="Random seed", info="Draw a new seed for each run.", elem_id="random-seed")
    with gr.Row():
        c["generate"] = gr.Button("Generate", variant="primary", elem_id="generate")
        c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop")
    c["decoding"] = gr.Radio(
        list(USER_DECODINGS), value=DEFAULT_DECODING, label="Decoding", info=decoding_info(), elem_id="decoding"
    )
    rounds, rows = (DECODINGS["ssd"].option(name) for name in ("verify_rounds", "vertical_rows"))
    default_takes = DECODINGS[DEFAULT_DECODING].option_names()  # the page starts as _decoding_changed leaves it
    with gr.Row():
        c["verify_rounds"] = gr.Slider(
            rounds.minimum,
            6,
            value=rounds.default,
            step=1,
            label="Rounds (ssd)",
            interactive="verify_rounds" in default_takes,
            info=_range_info(
                "At most this many verification rounds per row; 0 keeps drafts unchecked.", rounds.minimum, 6
            ),
            elem_id="rounds",
        )
        c["vertical_rows"] = gr.Slider(
            rows.minimum,
            max_vertical,
            value=rows.default,
            step=1,
            label="Rows drafted at once (ssd)",
            interactive="vertical_rows" in default_takes,
            info=_range_info("More rows: fewer passes, fewer drafts kept.", rows.minimum, max_vertical),
            elem_id="vertical-rows",
        )
    c["compare"] = gr.Checkbox(
        label="Compare with AR", info="Also decode with ar, same prompt and seed; show the speedup.", elem_id="compare"
    )
    with gr.Accordion("Sampling", open=False):
        c["num_images"] = gr.Slider(
            1, 8, value=1, step=1, label="Images", info="Images for the prompt, one batch.", elem_id="num-images"
        )
        c["guidance_scale"] = gr.Slider(
            1,
            10,
            value=guidance,
            step=0.5,
            label="Guidance scale",
            info="Classifier-free guidance: higher follows the prompt more closely; 1 turns it off.",
            elem_id="guidance",
        )
        c["temperature"] = gr.Slider(
            0,
            2,
            value=1,
            step=0.05,
            label="Temperature",
            info="0 is greedy; higher is more varied.",
            elem_id="temperature",
        )
        c["top_k"] = gr.Slider(
            0,
            grid.codebook_size,
            value=0,
            step=1,
            label="Top-k",
            info="Sample among the k likeliest codes only; 0 keeps all.",
            elem_id="top-k",
        )
    return c


def _results() -> dict[str, gr.components.Component]:
    """The outputs of Generate, keyed by the names `DemoEvents.generate` yields."""
    r = {}
    with gr.Row():
        r["preview"] = gr.Image(
            label="Live preview: rows appear as they are decoded",
            type="pil",
            format="png",
            interactive=False,
            height=290,
            elem_id="preview",
        )
        r["maps"] = gr.Image(
            label="Acceptance map (legend below)",
            type="pil",
            format="png",
            interactive=False,
            height=290,
            elem_id="maps",
        )
    r["status"] = gr.Markdown("Press **Generate** to start.", label="Status", elem_id="status")
    with gr.Row():
        r["images"] = gr.Gallery(
            label="Images",
            format="png",
            columns=4,
            height=200,
            object_fit="contain",
            fit_columns=False,
            elem_id="images",
        )
        r["ar_images"] = gr.Gallery(
            label="AR images (same prompt and seed)",
            format="png",
            columns=4,
            height=200,
            object_fit="contain",
            fit_columns=False,
            visible=False,
            elem_id="ar-images",
        )
    r["comparison"] = gr.Markdown(label="Speedup", elem_id="comparison")
    with gr.Row():
        gr.HTML(render.legend_html(), label="Legend", elem_id="legend")
        r["plot"] = gr.BarPlot(
            x="round",
            y="accepted",
            y_lim=[0, 1],
            label="Share of drafted cells accepted, per round",
            height=160,
            visible=False,
            elem_id="plot",
        )
    r["stats"] = gr.Markdown(label="Statistics", elem_id="stats")
    return r


def build_demo(pipe, model_name: str) -> gr.Blocks:
    """The Blocks over one loaded pipeline; queue and launch them (`cli`)."""
    events = DemoEvents(pipe)
    grid = pipe.image_backbone.grid
    height, width = pipe.image_backbone.image_size
    max_vertical = pipe.heads.max_vertical if pipe.heads is not None else 1
    with gr.Blocks(title="SSD demo", analytics_enabled=False) as demo:
        gr.Markdown(
            "# SSD: watch an image drawn row by row\n"
            "Spatially Speculative Decoding lets small heads draft a whole row of image codes from the row above, "
            "and the model verifies the row in one forward pass, where autoregressive (AR) decoding takes one pass "
            f"per code. Model: `{model_name}`, {grid.rows} x {grid.cols} codes, {width} x {height} px."
        )
        with gr.Row():
            with gr.Column(scale=2, min_width=340):
                controls = _controls(grid, max_vertical, pipe.image_backbone.default_guidance_scale)
            with gr.Column(scale=3):
                results = _results()
        generate, stop = controls.pop("generate"), controls.pop("stop")
        gr.on(
            [generate.click, controls["prompt"].submit],
            _bind(events.generate, results | {"seed": controls["seed"]}),
            [controls[name] for name in inspect.signature(events.generate).parameters if name != "request"],
            [*results.values(), controls["seed"]],
            api_name="generate",
            show_progress="hidden",  # the status line shows the progress, and an error once (no badge on each output)
        )
        stop.click(events.stop, None, None, queue=False, api_visibility="private")
        controls["decoding"].change(
            _decoding_changed,
            controls["decoding"],
            [controls[name] for name in ("verify_rounds", "vertical_rows", "compare")],
            queue=False,
            api_visibility="private",
        )
        controls["compare"].change(
            lambda on: gr.update(visible=on),
            controls["compare"],
            results["ar_images"],
            queue=False,
            api_visibility="private",
        )
        controls["random_seed"].change(
            lambda on: gr.update(interactive=not on),
            controls["random_seed"],
            controls["seed"],
            queue=False,
            api_visibility="private",
        )
    return demo
