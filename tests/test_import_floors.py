"""One way through the house: every import goes down a floor or stays on its own, and no two files import each other.

The floors, from the ground up (README, "Layout"):
0. declarations, free of engines: seeds, devices, plots, the sampling config and maths, the decodings' options and
   catalog;
1. models: the backbone adapters, the drafting heads, the VQ decoders, the reference model's parts;
2. decoding: the engine's strategies (ar, ssd, exact, auto) and their runs;
3. the peers, measured against the engine and built on its sliding window;
4. assembly: the pipeline, the loaders, the request object, the package's root;
5. faces: the command lines, the server, the demo, the ComfyUI nodes;
6. work done with the faces' parts: training, publishing, and the measurements beside the package (ssd_bench).

Imports inside functions count, and so do imports under `if TYPE_CHECKING:`: to read an annotation is to read
the module it names (hub.py once named the pipeline so, while the pipeline called into hub.py and hub.py back).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ssd_pipelines", "ssd_bench", "app", "comfy_nodes")

FLOORS = [  # (floor, module prefixes); a module takes the floor of its longest matching prefix
    (
        0,
        (
            "ssd_pipelines.seeds",
            "ssd_pipelines.devices",
            "ssd_pipelines.precisions",
            "ssd_pipelines.plots",
            "ssd_pipelines.sampling",
            "ssd_pipelines.sampling_config",
            "ssd_pipelines.acceptance",
            "ssd_pipelines.speedup",
            "ssd_pipelines.backend_logs",
            "ssd_pipelines.decoding.options",
            "ssd_pipelines.decoding.catalog",
        ),
    ),
    (
        1,
        (
            "ssd_pipelines.backbones",
            "ssd_pipelines.heads",
            "ssd_pipelines.vq",
            "ssd_pipelines.reference",
            "ssd_pipelines.finite_weights",
        ),
    ),
    (2, ("ssd_pipelines.decoding",)),
    (3, ("ssd_pipelines.peers",)),
    (
        4,
        (
            "ssd_pipelines",
            "ssd_pipelines.pipeline_ssd",
            "ssd_pipelines.hub",
            "ssd_pipelines.loading",
            "ssd_pipelines.memory",
            "ssd_pipelines.quantization",
            "ssd_pipelines.request",
            "ssd_pipelines.testing",
        ),
    ),
    (5, ("ssd_pipelines.cli", "ssd_pipelines.serving", "app", "comfy_nodes")),
    (6, ("ssd_pipelines.training", "ssd_bench", "ssd_pipelines.publishing")),
]


def floor_of(module: str) -> int:
    matches = [
        (len(prefix), floor)
        for floor, prefixes in FLOORS
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(matches)[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    found = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    return {name: path for name, path in found.items() if ".tools." not in name}  # tools: scripts beside the pack


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules `module` imports (a package's __init__ for `from package import name`, the submodule
    for `from package import submodule`)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            found.add(source)
            found |= {f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in known}
    return {name for name in found if name in known} - {module}


GRAPH = {module: imported(module, path, set(sources())) for module, path in sources().items()}


def test_every_module_has_a_floor():
    assert all(floor_of(module) is not None for module in GRAPH)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_import_runs_back_up_a_floor(module):
    upward = sorted(f"{name} (floor {floor_of(name)})" for name in GRAPH[module] if floor_of(name) > floor_of(module))
    assert not upward, f"{module} (floor {floor_of(module)}) imports {', '.join(upward)}"


def test_no_two_files_import_each_other():
    mutual = sorted({tuple(sorted((a, b))) for a, names in GRAPH.items() for b in names if a in GRAPH[b]})
    # a package's __init__ gathers its submodules, which may read their siblings through it: not a loop of files
    mutual = [(a, b) for a, b in mutual if not (b.startswith(a + ".") and (ROOT / a.replace(".", "/")).is_dir())]
    assert mutual == []


# The engine's per-call parts, which ssd_bench reaches only through ssd_pipelines.testing (engine_probes).
ENGINE_INSIDES = ("ssd_pipelines.decoding.", "ssd_pipelines.peers.")


def test_the_measurements_read_the_engine_only_through_its_public_api_and_the_testing_surface():
    reached = sorted(
        f"{module} imports {name}"
        for module, names in GRAPH.items()
        if module.startswith("ssd_bench")
        for name in names
        if name.startswith(ENGINE_INSIDES)
    )
    private = sorted(
        f"{path.name}:{node.lineno} .{node.attr}"
        for module, path in sources().items()
        if module.startswith("ssd_bench")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "torch", "sys"))
        and not (isinstance(node.value, ast.Attribute) and node.value.attr == "_dynamo")
    )
    assert reached == [], "reach these through ssd_pipelines.testing.engine_probes"
    assert private == [], "a private name of the library: add what the measurement needs to ssd_pipelines.testing"
