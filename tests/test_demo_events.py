"""The demo's handlers and page on the reference model, without a server: streaming rows, Stop, errors, seeds,
warnings, and the defaults and options read from the model and the library."""

import re
import threading
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
import torch

from app.events import OUTPUTS, DemoEvents
from app.runner import Settings, StopFlags
from app.ui import _decoding_changed, build_demo, example_prompts
from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.hub import BUNDLED_MODEL
from ssd_pipelines.seeds import MAX_SEED

PROMPT = "a red circle left of a blue square"


@pytest.fixture(scope="module")
def pipe():
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def events(pipe):
    return DemoEvents(pipe)


def session(name: str = "test-session"):
    return SimpleNamespace(session_hash=name)  # what the handlers read of a gr.Request


def rows_decoded(status: str) -> int | None:
    match = re.search(r"(\d+) of 16 rows decoded", status)
    return int(match.group(1)) if match else None


def test_options_a_decoding_does_not_take_are_left_out():
    settings = Settings(prompt=PROMPT, verify_rounds=3, vertical_rows=2, top_k=0, negative_prompt="")
    ssd, exact, ar = (settings.pipeline_kwargs(d) for d in ("ssd", "exact", "ar"))
    assert (ssd["verify_rounds"], ssd["vertical_rows"]) == (3, 2)
    assert not {"verify_rounds", "vertical_rows"} & set(exact)
    assert not {"verify_rounds", "vertical_rows"} & set(ar)
    assert ssd["top_k"] is None and ssd["negative_prompt"] is None  # the controls' "off" values
    assert ssd["guidance_scale"] is None  # the pipeline takes the model's own
    assert Settings(prompt=PROMPT, decoding="ssd").pipeline_kwargs()["verify_rounds"] == 2  # ssd's own default
    default = Settings(prompt=PROMPT).pipeline_kwargs()
    assert default["decoding"] == "auto" and not {"verify_rounds", "vertical_rows"} & set(default)


def test_the_page_starts_with_an_example_prompt_and_the_models_defaults(pipe):
    with build_demo(pipe, "reference") as demo:
        by_id = {block.elem_id: block for block in demo.blocks.values() if getattr(block, "elem_id", None)}
    assert by_id["prompt"].value == example_prompts()[0] == "a black square"
    assert by_id["prompt"].placeholder == "Describe the image (see the examples below)"
    assert by_id["guidance"].value == pipe.image_backbone.default_guidance_scale == 3.0
    assert (by_id["rounds"].value, by_id["vertical-rows"].value) == (2, 1)
    assert by_id["vertical-rows"].label == "Rows drafted at once (ssd)"
    info = by_id["decoding"].info
    assert "ssd: lossy, fastest" in info and "exact: lossless: the same distribution as ar" in info
    assert by_id["decoding"].value == "auto" and "The default, auto, is lossless" in info
    assert not by_id["rounds"].interactive and not by_id["vertical-rows"].interactive  # auto takes neither


def test_only_the_options_a_decoding_declares_stay_interactive():
    interactive = {d: [u["interactive"] for u in _decoding_changed(d)] for d in ("auto", "ssd", "exact", "ar")}
    assert interactive == {
        "auto": [False, False, True],
        "ssd": [True, True, True],
        "exact": [False, False, True],
        "ar": [False, False, False],
    }


def test_rows_stream_into_the_preview_before_the_final_images(events):
    updates = list(events.generate(PROMPT, seed=1))
    assert set(updates[0]) == set(OUTPUTS) and updates[0]["images"] is None  # the last run's results are cleared
    partial = [u for u in updates if rows_decoded(u.get("status", "")) not in (None, 16)]
    assert partial, [u.get("status") for u in updates]
    first = partial[0]
    pixels = np.asarray(first["preview"])  # 4x enlarged: a code row is 16 px
    assert pixels[: 16 * rows_decoded(first["status"])].any()
    assert not pixels[-16:].any(), "rows not decoded yet are black"
    final = updates[-1]
    assert set(final) == set(OUTPUTS)  # an API client sees only the last update
    (image, caption), *_ = final["images"]
    assert image.size == (64, 64) and caption == "auto (exact) 1"  # the default, and what it chose for one image
    assert final["maps"].size == (256, 256)
    assert final["status"].startswith("auto (exact): done, 16 rows in") and "forward passes" in final["stats"]
    assert updates.index(first) < len(updates) - 1


def test_stop_ends_the_run_between_rows_and_keeps_the_partial_images(events):
    run = events.generate(PROMPT, decoding="ar", compare=False, request=session())
    for update in run:
        if rows_decoded(update.get("status", "")):
            assert events.stops.stop("another-session") == 0  # Stop of another page stops nothing here
            assert events.stops.stop("test-session") == 1
            break
    final = list(run)[-1]
    stopped = re.fullmatch(r"ar: stopped after (\d+) of 16 rows", final["status"])
    assert stopped and int(stopped.group(1)) < 16
    image = np.asarray(final["images"][0][0])
    assert image[:4].any() and not image[-4:].any()


def test_stop_during_a_comparison_skips_the_ar_run(events):
    run = events.generate(PROMPT, compare=True, request=session())
    for update in run:
        if rows_decoded(update.get("status", "")):
            events.stops.stop("test-session")
            break
    updates = list(run)
    assert "stopped after" in updates[-1]["status"] and updates[-1]["ar_images"] is None
    assert not any(u.get("status", "").startswith("ar:") for u in updates)


def test_closing_the_stream_stops_the_call_and_its_thread(events):
    run = events.generate(PROMPT, decoding="ar")
    next(u for u in run if rows_decoded(u.get("status", "")))
    run.close()  # what Gradio does when the page goes away
    assert not [t for t in threading.enumerate() if t.name == "ssd-demo-call"]


@pytest.mark.parametrize(
    "controls",
    [
        {"prompt": ""},
        {"prompt": PROMPT, "decoding": "ssd", "vertical_rows": 99},
        {"prompt": PROMPT, "decoding": "ssd", "verify_rounds": -1},
    ],
    ids=["empty prompt", "k_v beyond the heads", "negative rounds"],
)
def test_bad_input_shows_the_pipelines_own_message(events, pipe, controls):
    with pytest.raises(ValueError) as expected:
        pipe(**Settings(**controls).pipeline_kwargs())
    run = events.generate(**controls)
    updates = []
    with pytest.raises(gr.Error) as shown:
        updates.extend(run)
    assert shown.value.message == str(expected.value) and shown.value.title == "Not generated"
    assert updates[-1]["status"] == f"**Not generated:** {expected.value}"
    assert updates[-1]["images"] is None and updates[-1]["preview"] is None  # no stale results under the message


@pytest.mark.parametrize(
    ("controls", "arguments"),
    [
        ({"num_images": 2.5}, {"num_images_per_prompt": 2.5}),
        ({"decoding": "ssd", "verify_rounds": 2.7}, {"decoding": "ssd", "verify_rounds": 2.7}),
        ({"top_k": 0.5}, {"top_k": 0.5}),
    ],
)
def test_fractional_integers_are_refused_not_truncated(events, pipe, controls, arguments):
    with pytest.raises(ValueError) as expected:
        pipe(PROMPT, **arguments)
    with pytest.raises(gr.Error) as shown:
        list(events.generate(PROMPT, **controls))
    assert shown.value.message == str(expected.value) and "got" in shown.value.message


def test_a_sliders_integer_float_is_taken_as_that_integer(events):
    controls = {"num_images": 2.0, "verify_rounds": 1.0, "vertical_rows": 1.0, "top_k": 5.0}
    final = list(events.generate(PROMPT, decoding="ssd", **controls))[-1]
    assert len(final["images"]) == 2 and final["status"].startswith("ssd: done")


def test_what_the_tokenizer_cut_from_the_prompt_is_shown_in_the_status(events, pipe):
    long = "four blue squares " * 5  # 15 words: the model reads 14, and no prompt past its 140 characters
    said = pipe(long, num_images_per_prompt=1).warnings
    assert said
    final = list(events.generate(long))[-1]
    assert final["status"].endswith("".join(f"\n\n**Prompt changed:** {w}" for w in said))


def test_comparing_ar_with_itself_is_refused(events):
    with pytest.raises(gr.Error, match="choose decoding auto, ssd, exact"):
        list(events.generate(PROMPT, decoding="ar", compare=True))


def test_a_random_seed_is_shown_and_redraws_the_same_images(events):
    drawn = list(events.generate(PROMPT, seed=0, random_seed=True))
    seed = drawn[0]["seed"]
    assert drawn[-1]["seed"] == seed
    again = list(events.generate(PROMPT, seed=seed))
    assert np.array_equal(np.asarray(again[-1]["images"][0][0]), np.asarray(drawn[-1]["images"][0][0]))


@pytest.mark.parametrize("seed", [-1, 2**64, True, 1.5])
def test_a_seed_out_of_the_rule_of_every_face_is_refused(events, seed):
    """seeds.py's rule, as the CLI, the server and the bulk job apply it; True is no seed 1."""
    with pytest.raises(gr.Error, match=f"Seed must be a whole number from 0 to {MAX_SEED}, got {seed!r}"):
        list(events.generate(PROMPT, seed=seed))


def test_the_handler_draws_any_seed_the_rule_takes_past_the_pages_box(events):
    """The page's Seed box stops at 2**32 - 1 (short, and exact in a browser); the handler checks the rule itself."""
    final = list(events.generate(PROMPT, seed=2**63, decoding="ar"))[-1]
    assert final["seed"] == 2**63 and final["status"].startswith("ar: done")


def test_stop_flags_belong_to_their_session_and_go_with_the_run():
    flags = StopFlags()
    with flags.track("a") as a, flags.track("a") as a2, flags.track("b") as b:
        assert flags.stop("a") == 2
        assert a.is_set() and a2.is_set() and not b.is_set()
    assert flags.stop("a") == 0 and flags.stop("b") == 0


def test_a_comparison_with_the_default_says_what_ran_and_that_it_is_lossless(events):
    final = list(events.generate(PROMPT, seed=2, compare=True))[-1]
    assert re.match(
        r"\*\*auto \(exact\) in this run: [\d.]+x fewer forward passes and ([\d.]+x (faster|slower) than|as fast as) ar\*\*",
        final["comparison"],
    ), final["comparison"]
    assert "auto (exact) is lossless: the same distribution as ar" in final["comparison"]
    assert final["ar_images"][0][1] == "ar 1" and final["images"][0][1] == "auto (exact) 1"
