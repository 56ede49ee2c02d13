"""Save the UI-format twin of each API workflow, and a screenshot of it, through a running ComfyUI's own frontend.

The frontend reads the API workflow (`app.loadApiJson`, as when one drops it on the page), lays the nodes out in
columns by depth, and serialises the graph it built: so the saved workflow is what ComfyUI itself writes.
With --run it also queues the graph and waits for it, so the screenshot shows the results on the nodes.

    ComfyUI running with this pack (say on port 8188); Debian's chromium; `pip install playwright`:
    python comfy_nodes/tools/render_workflows.py --url http://127.0.0.1:8188 --run --screenshots docs/images
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

WORKFLOWS = Path(__file__).resolve().parents[1] / "workflows"
HEADLESS_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip
COLUMN_WIDTH, ROW_GAP, LEFT, TOP = 470, 40, 40, 60

SIZES = {
    "SSDGenerate": [420, 760],
    "SaveImage": [360, 420],
    "PreviewImage": [360, 420],
    "PreviewAny": [360, 200],
}  # room for results

# Runs in the page: build the graph from the API workflow, place it in columns by depth, fix seeds, and return
# what the frontend's Export and Export (API) write (`graphToPrompt`).
LOAD_AND_LAYOUT = """
async ([api, name, sizes, column, gap, left, top]) => {
  await app.extensionManager?.setting?.set("Comfy.Minimap.Visible", false);
  await app.loadApiJson(api, name);
  const depth = {};
  const visit = (id) => {
    if (depth[id] !== undefined) return depth[id];
    const links = Object.values(api[id].inputs).filter((v) => Array.isArray(v));
    return (depth[id] = links.length ? 1 + Math.max(...links.map(([from]) => visit(from))) : 0);
  };
  const nextY = {};
  for (const id of Object.keys(api)) {
    const node = app.graph.getNodeById(+id);
    const d = visit(id);
    if (sizes[node.type]) node.size = sizes[node.type];
    node.pos = [left + d * column, nextY[d] ?? top];
    nextY[d] = node.pos[1] + node.size[1] + gap;
    for (const widget of node.widgets ?? []) {
      if (widget.name === "control_after_generate") widget.value = "fixed";  // the twin runs the same seed
    }
  }
  app.canvas.ds.offset = [0, 0];
  app.canvas.ds.scale = 0.8;
  app.graph.setDirtyCanvas(true, true);
  const { workflow, output } = await app.graphToPrompt();
  workflow.extra.ds = { scale: app.canvas.ds.scale, offset: [...app.canvas.ds.offset] };
  return JSON.stringify({ workflow, output });
}
"""


def render(url: str, chromium: str, run: bool, screenshots: Path | None) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=HEADLESS_ARGS)
        page = browser.new_page(viewport={"width": 1700, "height": 1400})
        # A new ComfyUI user gets the templates dialog on the first visit: have that visit here, not under a
        # screenshot. The frontend marks the tutorial done (on the server) before it opens the dialog.
        _open(page, url)
        page.wait_for_function("app.extensionManager.setting.get('Comfy.TutorialCompleted') === true")
        for api_file in sorted(WORKFLOWS.glob("*_api.json")):
            _open(page, url)
            api = json.loads(api_file.read_text())
            ui_file = api_file.with_name(api_file.name.removesuffix("_api.json") + ".json")
            args = [api, ui_file.name, SIZES, COLUMN_WIDTH, ROW_GAP, LEFT, TOP]
            saved = json.loads(page.evaluate(LOAD_AND_LAYOUT, args))
            if not _queues_the_same(saved["output"], api):
                raise SystemExit(f"the frontend queues something else than {api_file.name}: {saved['output']}")
            ui_file.write_text(json.dumps(saved["workflow"], indent=2) + "\n")
            print(f"wrote {ui_file}")
            if run:
                page.evaluate("app.queuePrompt(0, 1)")
                _wait_for_empty_queue(url)
                page.wait_for_timeout(1500)  # the last results reach the page over its websocket
            if screenshots is not None:
                screenshots.mkdir(parents=True, exist_ok=True)
                shot = screenshots / ui_file.with_suffix(".png").name
                page.screenshot(path=str(shot))
                print(f"wrote {shot}")
        browser.close()


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_function(
        "window.app && window.app.graph && Object.keys(LiteGraph.registered_node_types).length > 100"
    )


def _wait_for_empty_queue(url: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1.0)
        with urllib.request.urlopen(f"{url}/queue") as response:
            queue = json.load(response)
        if not queue["queue_running"] and not queue["queue_pending"]:
            return
    raise SystemExit(f"ComfyUI at {url} did not finish within {timeout:.0f} s")


def _queues_the_same(queued: dict, api: dict) -> bool:
    """Same nodes, classes, links and values; the frontend may add values of its own display widgets (Preview
    Any's text box), which the server ignores."""
    return queued.keys() == api.keys() and all(
        queued[i]["class_type"] == api[i]["class_type"]
        and all(queued[i]["inputs"].get(name) == value for name, value in api[i]["inputs"].items())
        and not any(isinstance(v, list) for name, v in queued[i]["inputs"].items() if name not in api[i]["inputs"])
        for i in api
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8188", help="a ComfyUI server that has this pack")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the browser to drive")
    parser.add_argument("--run", action="store_true", help="queue each workflow and wait for it before the screenshot")
    parser.add_argument("--screenshots", type=Path, help="folder for one PNG per workflow")
    args = parser.parse_args()
    render(args.url, args.chromium, args.run, args.screenshots)


if __name__ == "__main__":
    main()
