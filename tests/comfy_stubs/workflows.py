"""Checks a workflow against node schemas as ComfyUI's server and frontend read them: /object_info entries.

`api_errors` follows what POST /prompt validates (node classes, required inputs, input names, links to existing
outputs of a matching type, widget values within their options). `ui_errors` checks a workflow saved by the
frontend: node types, links recorded at both ends with the right types, and widget values in widget order.
`ui_to_api` turns a saved workflow into the API form the frontend would queue, to compare with its API twin.
"""

from __future__ import annotations

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
SEED_CONTROLS = {"fixed", "increment", "decrement", "randomize"}


def node_info(cls, display_name: str) -> dict:
    """A V1 node class as GET /object_info describes it (server.py `node_info`), the fields these checks read."""
    schema = cls.INPUT_TYPES()
    return {
        "input": schema,
        "input_order": {section: list(inputs) for section, inputs in schema.items()},
        "output": list(cls.RETURN_TYPES),
        "output_name": list(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)),
        "name": cls.__name__,
        "display_name": display_name,
        "description": getattr(cls, "DESCRIPTION", ""),
        "category": cls.CATEGORY,
        "output_node": bool(getattr(cls, "OUTPUT_NODE", False)),
    }


def _inputs(info: dict) -> dict[str, tuple]:
    """Connectable and widget inputs (not hidden ones), in the order the frontend lays them out."""
    found = {}
    for section in ("required", "optional"):
        for name in info["input_order"].get(section, []):
            kind, *rest = info["input"][section][name]
            found[name] = (kind, rest[0] if rest else {})
    return found


def _kind(kind) -> str:
    return "COMBO" if isinstance(kind, list) else kind


def _accepts(input_kind, output_kind: str) -> bool:
    if _kind(input_kind) == "*":
        return True
    return output_kind in str(_kind(input_kind)).split(",")


def _value_errors(where: str, kind, options: dict, value) -> list[str]:
    kind_name = _kind(kind)
    if kind_name == "COMBO":
        return [] if value in kind else [f"{where}: {value!r} is not one of {kind}"]
    checks = {
        "INT": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "FLOAT": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "BOOLEAN": lambda v: isinstance(v, bool),
        "STRING": lambda v: isinstance(v, str),
    }
    if kind_name not in checks:
        return [f"{where}: {kind_name} cannot be a literal value, it must be linked"]
    if not checks[kind_name](value):
        return [f"{where}: {value!r} is not a {kind_name}"]
    if "min" in options and value < options["min"] or "max" in options and value > options["max"]:
        return [f"{where}: {value!r} is outside {options.get('min')}..{options.get('max')}"]
    return []


def api_errors(workflow: dict, schemas: dict[str, dict]) -> list[str]:
    errors = []
    for node_id, node in workflow.items():
        info = schemas.get(node["class_type"])
        if info is None:
            errors.append(f"node {node_id}: no node class {node['class_type']!r}")
            continue
        inputs = _inputs(info)
        missing = set(info["input_order"].get("required", [])) - set(node["inputs"])
        errors += [f"node {node_id}: required input {name!r} missing" for name in sorted(missing)]
        for name, value in node["inputs"].items():
            where = f"node {node_id} ({node['class_type']}).{name}"
            if name not in inputs:
                errors.append(f"{where}: no such input")
            elif isinstance(value, list):
                errors += _link_errors(where, value, inputs[name][0], workflow, schemas)
            else:
                errors += _value_errors(where, *inputs[name], value)
    if not any(schemas[n["class_type"]]["output_node"] for n in workflow.values() if n["class_type"] in schemas):
        errors.append("no output node: ComfyUI would run nothing")
    return errors


def _link_errors(where: str, link: list, input_kind, workflow: dict, schemas: dict) -> list[str]:
    source_id, slot = link
    source = workflow.get(source_id)
    if source is None or source["class_type"] not in schemas:
        return [f"{where}: links to missing node {source_id!r}"]
    outputs = schemas[source["class_type"]]["output"]
    if not 0 <= slot < len(outputs):
        return [f"{where}: node {source_id} has no output {slot}"]
    if not _accepts(input_kind, outputs[slot]):
        return [f"{where}: takes {_kind(input_kind)}, linked to {outputs[slot]}"]
    return []


def _widgets(info: dict) -> list[tuple[str, tuple]]:
    """The frontend's widgets, in order; a control_after_generate input gets a second widget right after it."""
    widgets = []
    for name, (kind, options) in _inputs(info).items():
        if _kind(kind) in WIDGET_TYPES and not options.get("forceInput"):
            widgets.append((name, (kind, options)))
            if options.get("control_after_generate"):
                widgets.append((name + ".control", ([*SEED_CONTROLS], {})))
    return widgets


def ui_errors(workflow: dict, schemas: dict[str, dict]) -> list[str]:
    errors = []
    nodes = {node["id"]: node for node in workflow["nodes"]}
    for node in workflow["nodes"]:
        info = schemas.get(node["type"])
        if info is None:
            errors.append(f"node {node['id']}: no node class {node['type']!r}")
            continue
        inputs = _inputs(info)
        for slot in node.get("inputs", []):
            if slot["name"] not in inputs:
                errors.append(f"node {node['id']} ({node['type']}): no input {slot['name']!r}")
        for index, slot in enumerate(node.get("outputs", [])):
            if index >= len(info["output"]) or slot["type"] != info["output"][index]:
                errors.append(f"node {node['id']} ({node['type']}): output {index} is not {slot['type']}")
        widgets = _widgets(info)
        values = node.get("widgets_values", [])
        if len(values) != len(widgets):
            errors.append(f"node {node['id']} ({node['type']}): {len(values)} widget values for {len(widgets)} widgets")
        else:
            for (name, spec), value in zip(widgets, values, strict=True):
                errors += _value_errors(f"node {node['id']} ({node['type']}).{name}", *spec, value)
    for link_id, origin_id, origin_slot, target_id, target_slot, kind in workflow["links"]:
        where = f"link {link_id}"
        origin, target = nodes.get(origin_id), nodes.get(target_id)
        if origin is None or target is None:
            errors.append(f"{where}: joins missing nodes {origin_id} -> {target_id}")
            continue
        if origin_slot >= len(origin.get("outputs", [])) or target_slot >= len(target.get("inputs", [])):
            errors.append(
                f"{where}: joins slots that do not exist, {origin_id}:{origin_slot} -> {target_id}:{target_slot}"
            )
            continue
        if link_id not in (origin["outputs"][origin_slot].get("links") or []):
            errors.append(f"{where}: not listed by node {origin_id}'s output {origin_slot}")
        target_input = target["inputs"][target_slot]
        if target_input.get("link") != link_id:
            errors.append(f"{where}: not the link of node {target_id}'s input {target_input['name']!r}")
        if origin["type"] in schemas and target["type"] in schemas:
            output_kind = schemas[origin["type"]]["output"][origin_slot]
            input_kind = _inputs(schemas[target["type"]]).get(target_input["name"], ("?", {}))[0]
            # The frontend marks a link with the output's type, or "*" when it ends at an any-type input.
            marks = {output_kind, "*"} if _kind(input_kind) == "*" else {output_kind}
            if kind not in marks or not _accepts(input_kind, output_kind):
                errors.append(
                    f"{where}: {output_kind} into {target_input['name']} ({_kind(input_kind)}), marked {kind}"
                )
    return errors


def ui_to_api(workflow: dict, schemas: dict[str, dict]) -> dict:
    """The API-format prompt of a saved workflow: widget values by input name, links as [source id, slot]."""
    links = {link[0]: link for link in workflow["links"]}
    prompt = {}
    for node in workflow["nodes"]:
        widgets = [name for name, _ in _widgets(schemas[node["type"]])]
        inputs = {
            name: value for name, value in zip(widgets, node.get("widgets_values", []), strict=True) if "." not in name
        }
        for slot in node.get("inputs", []):
            if slot.get("link") is not None:
                _, origin_id, origin_slot, *_ = links[slot["link"]]
                inputs[slot["name"]] = [str(origin_id), origin_slot]
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt
