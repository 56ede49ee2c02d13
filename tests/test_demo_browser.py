"""The demo in a real browser (Playwright driving Debian's Chromium): type, Generate, watch, compare, stop, errors.

Set SSD_DEMO_SCREENSHOT=docs/demo.png to write the README's screenshot from the comparison test.
"""

import contextlib
import itertools
import os
import re
import shutil
from pathlib import Path

import PIL.Image
import pytest
import torch
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect, sync_playwright

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.hub import BUNDLED_MODEL

CHROMIUM = "/usr/bin/chromium"
# Headless as root, and quiet: nothing but the page may go on the (closed) network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PROMPT = "a red circle left of a blue square"
WAIT_MS = 120_000  # a generation on a busy two-core machine, with a browser beside it
SETTLE_MS = 30_000  # a picture on a busy machine settles within seconds; a collapsed one never does
PREVIEW_SIZE = (
    "img => img ? [img.complete, img.naturalWidth, img.naturalHeight, img.getBoundingClientRect().width] : []"
)
# True once the preview has been loaded and laid out at full width for 3 polls in a row.
SETTLED_AT_FULL_SIZE = f"""() => {{
  const s = ({PREVIEW_SIZE})(document.querySelector('#preview img'));
  window.previewPolls = s[0] && s[1] > 0 && s[3] > 250 ? (window.previewPolls || 0) + 1 : 0;
  return window.previewPolls >= 3;
}}"""
# Counts the runs that have finished: status texts that say "<decoding>: done" after one that did not. The text
# of the run before satisfies a wait for "done" until the next run's first update lands.
COUNT_RUNS_DONE = """() => { window.runsDone = 0; let wasDone = false; const status = document.querySelector('#status');
  new MutationObserver(() => { const done = /[\\w)]: done/.test(status.innerText);
    if (done && !wasDone) window.runsDone += 1; wasDone = done; })
    .observe(status, {subtree: true, childList: true, characterData: true}); }"""
# The preview picture and its ancestors as laid out: tag, class, width, display.
LAYOUT = """() => { const out = []; for (let e = document.querySelector('#preview img'); e && out.length < 6;
  e = e.parentElement) out.push([e.tagName, String(e.className), e.getBoundingClientRect().width,
  getComputedStyle(e).display]); return out; }"""
CONTROLS = [
    "prompt",
    "negative-prompt",
    "seed",
    "random-seed",
    "decoding",
    "rounds",
    "vertical-rows",
    "compare",
    "num-images",
    "guidance",
    "temperature",
    "top-k",
]
# Marks in the page's own clock: the click on Generate, each status text, previews and gallery images loaded.
RECORDER = """() => {
  window.marks = [];
  const mark = (what) => window.marks.push([performance.now(), what]);
  document.querySelector('#generate').addEventListener('click', () => mark('click'), {capture: true});
  const status = document.querySelector('#status');
  new MutationObserver(() => mark('status ' + status.innerText.trim()))
    .observe(status, {subtree: true, childList: true, characterData: true});
  // On the document, not on the components: Gradio may mount a component's element anew during a run.
  document.addEventListener('load', (event) => {
    for (const id of ['preview', 'images']) {
      if (event.target.closest && event.target.closest('#' + id)) mark(id);
    }
  }, {capture: true});
}"""


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM):
        message = f"no {CHROMIUM}: install Debian's chromium (apt-get install chromium), as .ci/run does"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, demo_server):
    """A fresh page (its own Gradio session); `page.requests` lists every URL it asked for."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.requests = []
    page.on("request", lambda request: page.requests.append(request.url))
    page.goto(demo_server.url)
    page.locator("#generate").wait_for()
    yield page
    context.close()


def pipeline_message(**kwargs) -> str:
    """The ValueError the pipeline itself raises for these arguments."""
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    with pytest.raises(ValueError) as error:
        pipe(**kwargs)
    return str(error.value)


def test_generate_streams_rows_into_the_preview_then_shows_images_map_and_statistics(page):
    """With ar (256 passes, seconds on this CPU): a busy machine can let ssd finish before the page has polled
    once, and the page rightly skips previews it has no time for; ar always leaves time for some."""
    page.locator("#prompt textarea").fill(PROMPT)
    page.get_by_role("radio", name="ar").check()
    page.evaluate(RECORDER)
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text("ar: done", timeout=WAIT_MS)
    expect(page.locator("#images img")).to_have_count(1)
    expect(page.locator("#stats")).to_contain_text("forward passes")

    marks = page.evaluate("window.marks")
    times = {what: t for t, what in reversed(marks)}  # the first time of each mark
    partial = [t for t, what in marks if re.fullmatch(r"status ar: ([1-9]|1[0-5]) of 16 rows decoded", what)]
    assert partial and min(partial) < times["images"], marks
    assert times["preview"] < times["images"], "a preview was drawn before the final image"
    print(f"\nGenerate to the first preview row: {(times['preview'] - times['click']) / 1000:.2f} s")
    for selector in ("#images img", "#maps img", "#preview img"):
        assert page.locator(selector).evaluate("img => img.complete && img.naturalWidth > 0"), selector


def test_compare_shows_both_images_and_the_speedup(page, tmp_path):
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#compare input").check()
    page.locator("#generate").click()
    expect(page.locator("#comparison")).to_contain_text(
        re.compile(
            r"auto \(exact\) in this run: [\d.]+x fewer forward passes and ([\d.]+x (faster|slower) than|as fast as) ar"
        ),
        timeout=WAIT_MS,
    )
    expect(page.locator("#plot")).to_be_visible()  # acceptance per round: the default, auto, ran exact's drafts
    for gallery in ("#images", "#ar-images"):
        expect(page.locator(f"{gallery} img")).to_have_count(1)
        assert page.locator(f"{gallery} img").evaluate("img => img.complete && img.naturalWidth == 64")
    expect(page.locator("#stats th")).to_have_text(["", "auto (exact)", "ar"])
    expect(page.locator("#comparison")).to_contain_text("auto (exact) is lossless: the same distribution as ar")
    shot = Path(os.environ.get("SSD_DEMO_SCREENSHOT") or tmp_path / "demo.png")
    page.screenshot(path=shot, full_page=True)
    PIL.Image.open(shot).convert("RGB").quantize(colors=128).save(shot, optimize=True)  # small, for the repo
    assert shot.stat().st_size < 400_000


def test_stop_ends_the_generation_and_keeps_the_rows_drawn(page):
    page.locator("#prompt textarea").fill(PROMPT)
    expect(page.locator("#rounds input[type=number]")).to_be_disabled()  # the default, auto, takes no rounds
    page.get_by_role("radio", name="ssd").check()
    expect(page.locator("#rounds input[type=number]")).to_be_enabled()
    page.get_by_role("radio", name="ar").check()
    expect(page.locator("#compare input")).to_be_disabled()  # ar beside ar: nothing to compare
    expect(page.locator("#rounds input[type=number]")).to_be_disabled()  # rounds and k_v are ssd's
    expect(page.locator("#vertical-rows input[type=number]")).to_be_disabled()
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text(re.compile(r"ar: \d+ of 16 rows decoded"), timeout=WAIT_MS)
    page.locator("#stop").click()
    expect(page.locator("#status")).to_contain_text(re.compile(r"ar: stopped after \d+ of 16 rows"), timeout=WAIT_MS)
    rows = int(re.search(r"after (\d+) of", page.locator("#status").inner_text()).group(1))
    assert rows < 16
    expect(page.locator("#images img")).to_have_count(1)


def test_the_first_click_draws_and_a_failed_run_says_why_once_and_clears_the_last_results(page):
    expect(page.locator("#prompt textarea")).to_have_value("a black square")  # the first example, not a placeholder
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text("auto (exact): done", timeout=WAIT_MS)
    expect(page.locator("#images img")).to_have_count(1)

    message = pipeline_message(prompt="")
    page.locator("#prompt textarea").fill("")
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text(f"Not generated: {message}".replace("`", ""), timeout=WAIT_MS)
    expect(page.get_by_test_id("toast-body")).to_have_count(1)
    expect(page.get_by_test_id("toast-text")).to_have_text(message)
    expect(page.locator("#images img")).to_have_count(0)  # the last run's results are gone
    expect(page.locator("#preview img")).to_have_count(0)
    expect(page.locator("#seed input")).to_have_value("0")
    badges = page.locator('[data-testid="status-tracker"] .error')  # Gradio's "Error" over each output
    assert badges.evaluate_all("els => els.filter(e => e.checkVisibility()).length") == 0
    assert "Traceback" not in page.content()


def test_the_preview_keeps_its_size_run_after_run(page):
    """Gradio rewrote a repeated picture's file in place, and a preview fetched meanwhile collapsed to 20 px."""
    page.evaluate(COUNT_RUNS_DONE)
    for seed in range(4):
        page.locator("#seed input").fill(str(seed))
        page.locator("#generate").click()
        page.wait_for_function(f"window.runsDone > {seed}", polling=50, timeout=WAIT_MS)  # this run, not the last
        # a picture being swapped is 0 px, then laid out 0 px wide, for a while on a loaded CPU: wait, bounded,
        # for it to stay at full size for a few polls, read in the page (no swap between the check and the read).
        # A collapsed one settles at 20 px or 0 px, and the assertion says so, with the layout around it.
        page.evaluate("() => { window.previewPolls = 0; }")
        with contextlib.suppress(PlaywrightTimeoutError):
            page.wait_for_function(SETTLED_AT_FULL_SIZE, polling=100, timeout=SETTLE_MS)
        size, layout = page.evaluate(f"() => [({PREVIEW_SIZE})(document.querySelector('#preview img')), ({LAYOUT})()]")
        assert size[:3] == [True, 256, 256] and size[3] > 250, (seed, size, layout)


def test_the_exact_bar_plot_orders_its_rounds_as_numbers_with_labels_apart(page):
    page.get_by_role("radio", name="exact").check()
    page.locator("#generate").click()
    expect(page.locator("#status")).to_contain_text("exact: done", timeout=WAIT_MS)
    labels = page.locator('#plot g[aria-label^="X-axis"] .role-axis-label text')
    expect(labels.first).to_be_visible()
    texts = [label.text_content() for label in labels.all()]
    assert len(texts) >= 10 and texts == [str(k) for k in range(1, len(texts) + 1)], texts
    boxes = [label.bounding_box() for label in labels.all()]
    assert all(a["x"] + a["width"] <= b["x"] for a, b in itertools.pairwise(boxes)), boxes


def test_the_page_says_which_decoding_is_lossy_and_which_lossless(page):
    info = page.locator("#decoding .info-text").inner_text()
    assert "ssd: lossy, fastest" in info and "exact: lossless: the same distribution as ar" in info, info
    expect(page.locator("#legend")).to_contain_text("from the model")
    expect(page.locator("#vertical-rows")).to_contain_text("Rows drafted at once")


def test_every_control_explains_itself_and_the_page_stays_offline(page, demo_server):
    page.get_by_text("Sampling").click()  # open the accordion
    for control in CONTROLS:
        info = page.locator(f"#{control} .info-text")
        expect(info).to_be_visible()
        assert len(info.inner_text()) > 10, control
    for button in ("#generate", "#stop"):
        assert len(page.locator(button).get_attribute("title") or "") > 10, button
    page.wait_for_load_state("networkidle")
    assert page.requests and all(url.startswith(demo_server.url) for url in page.requests), page.requests
