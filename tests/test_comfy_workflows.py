"""The shipped workflows (comfy_nodes/workflows/) against the node schemas: our nodes' INPUT_TYPES and the
built-in nodes' /object_info entries recorded from a real ComfyUI (tests/comfy_stubs/builtin_nodes.json).
Each UI workflow must queue exactly its API twin, and the API workflows run on the reference model."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from comfy_stubs.workflows import api_errors, node_info, ui_errors, ui_to_api

WORKFLOWS = Path(__file__).resolve().parents[1] / "comfy_nodes" / "workflows"
BUILTIN = json.loads((Path(__file__).parent / "comfy_stubs" / "builtin_nodes.json").read_text())["nodes"]
TWINS = [("ssd_generate.json", "ssd_generate_api.json"), ("ssd_vs_ar.json", "ssd_vs_ar_api.json")]


@pytest.fixture(scope="module")
def schemas(comfy_pack, ssd_models) -> dict[str, dict]:
    ours = {
        name: node_info(cls, comfy_pack.NODE_DISPLAY_NAME_MAPPINGS[name])
        for name, cls in comfy_pack.NODE_CLASS_MAPPINGS.items()
    }
    return BUILTIN | ours


@pytest.fixture(scope="module")
def ssd_models(comfy_pack):  # an empty models/ssd: the workflows must need only the bundled reference model
    return None


def load(name: str) -> dict:
    return json.loads((WORKFLOWS / name).read_text())


def test_every_workflow_file_has_its_twin():
    assert sorted(path.name for path in WORKFLOWS.glob("*.json")) == sorted(name for pair in TWINS for name in pair)


@pytest.mark.parametrize("ui_name, api_name", TWINS)
def test_workflows_match_the_schemas_and_each_other(schemas, ui_name, api_name):
    ui, api = load(ui_name), load(api_name)
    assert api_errors(api, schemas) == []
    assert ui_errors(ui, schemas) == []
    assert ui_to_api(ui, schemas) == {
        node_id: {k: v for k, v in node.items() if k != "_meta"} for node_id, node in api.items()
    }


def test_the_checks_catch_broken_workflows(schemas):
    """The checks are only worth their passes if they fail: break a workflow in each way they look for."""
    broken = load("ssd_vs_ar_api.json")
    broken["2"]["class_type"] = "SSDGenerator"
    broken["3"]["inputs"]["decoding"] = "fast"
    broken["3"]["inputs"]["rounds"] = 99
    broken["4"]["inputs"]["image2"] = ["3", 1]
    broken["5"]["inputs"]["filename"] = "x"
    del broken["8"]["inputs"]["codes"]
    assert api_errors(broken, schemas) == [
        "node 2: no node class 'SSDGenerator'",
        "node 3 (SSDGenerate).decoding: 'fast' is not one of ['auto', 'ssd', 'exact', 'ar']",
        "node 3 (SSDGenerate).rounds: 99 is outside 0..16",
        "node 4 (ImageStitch).image1: links to missing node '2'",
        "node 4 (ImageStitch).image2: takes IMAGE, linked to SSD_CODES",
        "node 5 (SaveImage).filename: no such input",
        "node 6 (PreviewAny).source: links to missing node '2'",
        "node 8: required input 'codes' missing",
    ]

    broken = load("ssd_vs_ar.json")
    nodes = {node["id"]: node for node in broken["nodes"]}
    nodes[2]["widgets_values"].pop()
    nodes[4]["inputs"][1]["name"] = "image3"
    into_ar = next(link for link in broken["links"] if link[3] == 2)  # [id, from, slot, to, slot, type]
    into_ar[5] = "IMAGE"
    ssd_images = next(link for link in broken["links"] if link[1:3] == [3, 0])
    ssd_images[4] = 0  # AR's and SSD's images both into image1
    assert ui_errors(broken, schemas) == [
        "node 2 (SSDGenerate): 10 widget values for 11 widgets",
        "node 4 (ImageStitch): no input 'image3'",
        f"link {into_ar[0]}: SSD_PIPELINE into pipeline (SSD_PIPELINE), marked IMAGE",
        f"link {ssd_images[0]}: not the link of node 4's input 'image1'",
    ]


@pytest.mark.parametrize("api_name", [api for _, api in TWINS])
def test_api_workflows_run_on_the_reference_model(comfy_pack, api_name):
    """Execute our nodes in ComfyUI's order and check what reaches each built-in node's inputs (the built-in
    nodes themselves do not run here: tests/test_comfy_integration.py runs them in a real ComfyUI)."""
    workflow, results, checked = load(api_name), {}, []
    for node_id in sorted(workflow, key=lambda node_id: _depth(workflow, node_id)):
        node = workflow[node_id]
        links = {name: value for name, value in node["inputs"].items() if isinstance(value, list)}
        if any(results[source] is None for source, _ in links.values()):
            results[node_id] = None  # downstream of a built-in node
            continue
        inputs = node["inputs"] | {name: results[source][slot] for name, (source, slot) in links.items()}
        cls = comfy_pack.NODE_CLASS_MAPPINGS.get(node["class_type"])
        if cls is not None:
            if hasattr(cls, "VALIDATE_INPUTS"):  # ComfyUI calls it, with the inputs it names, when a prompt is queued
                names = inspect.signature(cls.VALIDATE_INPUTS).parameters
                assert cls.VALIDATE_INPUTS(**{name: inputs[name] for name in names}) is True, node_id
            results[node_id] = getattr(cls(), cls.FUNCTION)(**inputs)
            continue
        results[node_id] = None
        info = BUILTIN[node["class_type"]]["input"]
        for name in links:
            kind = {**info["required"], **info.get("optional", {})}[name][0]
            value = inputs[name]
            if kind == "IMAGE":
                assert value.dtype == torch.float32 and value.ndim == 4 and value.shape[-1] == 3
                assert 0.0 <= value.min() and value.max() <= 1.0
            else:
                assert kind == "*" and value.startswith("decoding: ")
            checked.append((node_id, name))
    ours_into_builtin = [
        (node_id, name)
        for node_id, node in workflow.items()
        if node["class_type"] in BUILTIN
        for name, value in node["inputs"].items()
        if isinstance(value, list) and workflow[value[0]]["class_type"] not in BUILTIN
    ]
    assert sorted(checked) == sorted(ours_into_builtin) and checked


def _depth(workflow: dict, node_id: str) -> int:
    links = [value[0] for value in workflow[node_id]["inputs"].values() if isinstance(value, list)]
    return 1 + max((_depth(workflow, source) for source in links), default=-1)
