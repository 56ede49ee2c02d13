"""The node pack in a real ComfyUI. Skipped unless COMFYUI_DIR names a ComfyUI source folder whose requirements
are installed (comfy_nodes/tools/setup_comfyui.sh prepares one; its Python is COMFYUI_PYTHON, by default
$COMFYUI_DIR/.venv/bin/python).

The server starts with --cpu on a free port, with a temporary base directory whose custom_nodes/ holds a link
to this repository, as `git clone` into custom_nodes/ leaves it. The tests queue the shipped API workflows
through POST /prompt, poll GET /history, check the saved images and the log, compare the server's
/object_info with the schemas the CI tests use, and press Cancel (POST /interrupt) during a long decoding.
Run with -s to see the prompt ids, image paths and seconds.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
from comfy_stubs import REPO
from comfy_stubs.workflows import node_info

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = pytest.mark.skipif(
    not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI source folder (comfy_nodes/tools/setup_comfyui.sh)"
)
WORKFLOWS = REPO / "comfy_nodes" / "workflows"
BUILTIN = json.loads((Path(__file__).parent / "comfy_stubs" / "builtin_nodes.json").read_text())["nodes"]
STARTUP_S, RUN_S = 240, 600


@dataclass
class Server:
    url: str
    base: Path
    log: Path

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.load(response)

    def post(self, path: str, body: dict | None = None):
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text.strip() else None

    def queue(self, workflow: dict) -> str:
        prompt_id = str(uuid.uuid4())
        answer = self.post("/prompt", {"prompt": workflow, "prompt_id": prompt_id, "client_id": "ssd-pipelines-test"})
        assert answer["prompt_id"] == prompt_id and answer["node_errors"] == {}, answer
        return prompt_id

    def wait(self, prompt_id: str) -> dict:
        deadline = time.monotonic() + RUN_S
        while time.monotonic() < deadline:
            history = self.get(f"/history/{prompt_id}")
            if history:
                return history[prompt_id]
            time.sleep(0.25)
        raise AssertionError(f"prompt {prompt_id} did not finish within {RUN_S} s; log: {self.log}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    comfyui = Path(COMFYUI_DIR).resolve()
    python = os.environ.get("COMFYUI_PYTHON") or str(comfyui / ".venv" / "bin" / "python")
    base = tmp_path_factory.mktemp("comfyui-base")
    (base / "custom_nodes").mkdir()
    (base / "custom_nodes" / "ssd-pipelines").symlink_to(REPO, target_is_directory=True)
    port = _free_port()
    command = [
        python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--disable-auto-launch",
        "--base-directory", str(base), "--output-directory", str(base / "output"),
        "--database-url", f"sqlite:///{base / 'comfyui.db'}",  # its own database: newer versions lock theirs
    ]  # fmt: skip
    log = base / "server.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=comfyui, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"HF_HUB_OFFLINE": "1"}
        )
    server = Server(f"http://127.0.0.1:{port}", base, log)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert process.poll() is None, f"ComfyUI exited ({process.returncode}):\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, (
                f"ComfyUI did not answer within {STARTUP_S} s:\n{log.read_text()[-4000:]}"
            )
            try:
                server.get("/object_info/SSDGenerate")
                break
            except OSError:
                time.sleep(0.5)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _load(name: str) -> dict:
    return json.loads((WORKFLOWS / name).read_text())


def test_log_shows_the_pack_imported(server):
    log = server.log.read_text()
    version = re.search(r"ComfyUI version: (\S+)", log)
    print(f"\nComfyUI {version.group(1) if version else '(version not logged)'} from {COMFYUI_DIR}")
    assert re.search(r"^\s*[\d.]+ seconds: .*custom_nodes/ssd-pipelines$", log, re.MULTILINE), log[-4000:]
    assert not [line for line in log.splitlines() if "Cannot import" in line and "ssd-pipelines" in line]
    # CI's ComfyUI has no torchaudio (.ci/run): only ComfyUI's own audio nodes may fail to import.
    failed = set(re.findall(r"^IMPORT FAILED: (\S+)$", log, re.MULTILINE))
    assert failed <= {"nodes_audio.py", "nodes_audio_encoder.py"}, failed


def node_info_of(comfy_pack) -> dict:
    """The loader as this environment describes it."""
    loader = comfy_pack.NODE_CLASS_MAPPINGS["SSDPipelineLoader"]
    return node_info(loader, comfy_pack.NODE_DISPLAY_NAME_MAPPINGS["SSDPipelineLoader"])


def _signature(info: dict) -> dict:
    """What workflows depend on: input names by section, their types (or choices), outputs."""
    inputs = {
        section: {name: spec[0] for name, spec in info["input"].get(section, {}).items()}
        for section in ("required", "optional")
    }
    return {"input": inputs, "output": list(info["output"]), "output_node": info["output_node"]}


def test_object_info_matches_the_schemas_ci_checks_against(server, comfy_pack):
    info = server.get("/object_info")
    # The loader lists the precisions its environment runs: ComfyUI's, without torchao or bitsandbytes in CI, may
    # list fewer than this one's. The float ones and "auto" need nothing.
    theirs, mine = (i["input"]["required"]["dtype"][0] for i in (info["SSDPipelineLoader"], node_info_of(comfy_pack)))
    assert ["auto", "float32", "float16", "bfloat16"] == theirs[:4] and set(theirs) <= set(mine), (theirs, mine)
    for name, cls in comfy_pack.NODE_CLASS_MAPPINGS.items():
        ours = json.loads(json.dumps(node_info(cls, comfy_pack.NODE_DISPLAY_NAME_MAPPINGS[name])))
        if name == "SSDPipelineLoader":
            ours["input"]["required"]["dtype"][0] = info[name]["input"]["required"]["dtype"][0]
        assert {key: info[name][key] for key in ours} == ours, name
    for name, recorded in BUILTIN.items():
        assert _signature(info[name]) == _signature(recorded), (
            f"tests/comfy_stubs/builtin_nodes.json is stale for {name}"
        )


def test_a_guidance_below_1_is_refused_when_queued(server):
    workflow = _load("ssd_generate_api.json")
    workflow["2"]["inputs"]["guidance"] = 0.5
    with pytest.raises(urllib.error.HTTPError) as refused:
        server.post("/prompt", {"prompt": workflow})
    assert refused.value.code == 400
    (error,) = json.load(refused.value)["node_errors"]["2"]["errors"]
    assert error["type"] == "custom_validation_failed" and "0.5 is no guidance scale" in error["details"]


@pytest.mark.parametrize(
    "api_name, size", [("ssd_generate_api.json", (64, 64)), ("ssd_vs_ar_api.json", (64 + 4 + 64, 64))]
)
def test_api_workflow_runs_and_saves_images(server, api_name, size):
    workflow = _load(api_name)
    started = time.monotonic()
    prompt_id = server.queue(workflow)
    entry = server.wait(prompt_id)
    seconds = time.monotonic() - started
    assert entry["status"]["status_str"] == "success" and entry["status"]["completed"], entry["status"]
    (save_id,) = [i for i, node in workflow.items() if node["class_type"] == "SaveImage"]
    images = entry["outputs"][save_id]["images"]
    batch = {node["inputs"]["batch_size"] for node in workflow.values() if node["class_type"] == "SSDGenerate"}
    assert len(images) == batch.pop()
    paths = []
    for image in images:
        assert image["type"] == "output"
        path = server.base / "output" / image["subfolder"] / image["filename"]
        with PIL.Image.open(path) as saved:
            assert saved.size == size and saved.mode == "RGB"
            assert np.asarray(saved).std() > 10, "a real picture, not a flat colour"
        paths.append(str(path))
    texts = [text for node_id, out in entry["outputs"].items() if "text" in out for text in out["text"]]
    assert texts and all("forward passes: " in text for text in texts)
    print(f"\n{api_name}: prompt {prompt_id} succeeded in {seconds:.1f} s; images {paths}; stats {texts}")


def test_cancel_stops_a_long_decoding(server):
    workflow = _load("ssd_generate_api.json")
    workflow["2"]["inputs"] |= {"decoding": "exact", "batch_size": 16, "seed": 1, "preview": False}
    prompt_id = server.queue(workflow)
    deadline = time.monotonic() + RUN_S
    while not any(item[1] == prompt_id for item in server.get("/queue")["queue_running"]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(2.0)  # well into the decoding: the pipeline is loaded already, exact x 16 takes far longer
    pressed = time.monotonic()
    server.post("/interrupt")
    entry = server.wait(prompt_id)
    stopped_after = time.monotonic() - pressed
    assert entry["status"]["status_str"] == "error"
    assert "execution_interrupted" in [message[0] for message in entry["status"]["messages"]]
    assert entry["outputs"].get("3") is None, "nothing was saved"
    print(f"\ncancel: prompt {prompt_id} stopped {stopped_after:.2f} s after POST /interrupt")
    # The shared pipeline still works.
    workflow["2"]["inputs"] |= {"decoding": "ssd", "batch_size": 1}
    assert server.wait(server.queue(workflow))["status"]["status_str"] == "success"
