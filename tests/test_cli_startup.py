"""The first seconds of every command: --help and a usage error answer before torch, diffusers or transformers load.

Each case runs in a fresh interpreter (this one has loaded them long ago) and reports which of them its parsing
imported. Module sets, not timings: timings are noisy on a shared machine.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "diffusers", "transformers")
PARSE = f"""
import contextlib, importlib, io, json, sys
module, function, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
text, status = io.StringIO(), 0
with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
    try:
        getattr(importlib.import_module(module), function)(argv)
    except SystemExit as exit:  # a message instead of a status is printed and exits 1, as Python does
        status = 1 if isinstance(exit.code, str) else exit.code
        text.write(exit.code if isinstance(exit.code, str) else "")
print(json.dumps({{"status": status, "text": text.getvalue(), "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def parse_in_a_fresh_interpreter(module: str, function: str, argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PARSE, module, function, json.dumps(argv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("module", "function", "argv", "status", "says"),
    [
        ("ssd_pipelines.cli", "parse_args", ["--help"], 0, "usage: ssd-generate"),
        ("ssd_pipelines.cli", "parse_args", ["a red circle"], 2, "the following arguments are required: --out"),
        (
            "ssd_pipelines.cli",
            "parse_args",
            ["a", "--out", "x.png", "--decoding", "ar", "--rounds", "1"],
            2,
            "--rounds",
        ),
        ("ssd_pipelines.cli", "parse_args", ["a", "--out", "x.png", "--seed", "-1"], 2, "--seed must be"),
        ("ssd_pipelines.serving.cli", "parse_args", ["--help"], 0, "usage: ssd-serve"),
        ("ssd_pipelines.serving.cli", "parse_args", ["--replicas", "0"], 2, "--replicas must be >= 1"),
        ("ssd_bench", "main", [], 1, "usage: ssd-bench"),
        ("ssd_bench", "main", ["no-such-benchmark"], 1, "usage: ssd-bench"),
        ("ssd_bench", "main", ["exactness", "--help"], 0, "grids drawn per strategy"),
        ("ssd_bench", "main", ["reference", "--help"], 0, "images scored per prompt (GenEval: 4)"),
        ("ssd_bench", "main", ["sweep", "--help"], 0, "key=value[,key=value] of guidance"),
        ("ssd_bench", "main", ["peers", "--help"], 0, "grid sides of the scaling run"),
        ("ssd_bench", "main", ["window", "--help"], 0, "default: 4 to 8 rows"),
        ("ssd_bench", "main", ["pipelined", "--help"], 0, "single-image timed calls per decoding"),
        ("ssd_bench", "main", ["drafters", "--help"], 0, "LABEL=FOLDER of heads; repeat to compare"),
        ("ssd_bench", "main", ["recheck", "--help"], 0, "usage: ssd-bench recheck"),
        ("ssd_bench", "main", ["serve", "--help"], 0, "Serving under load"),
        ("ssd_bench", "main", ["gpu", "--help"], 0, "folder of gpu.md and gpu.json"),
        ("ssd_bench", "main", ["quantization", "--help"], 0, "the table; .json and .png beside it"),
        ("ssd_bench", "main", ["reference", "--no-such-flag"], 2, "unrecognized arguments"),
        ("ssd_bench", "main", ["gpu", "--sections", "AZ"], 2, "letters of ABCEQ, each once, got 'AZ'"),
        ("ssd_bench", "main", ["sweep", "--setting", "guidence=5"], 2, "bad setting 'guidence=5'"),
        ("ssd_bench", "main", ["drafters"], 2, "the following arguments are required: --heads"),
        ("ssd_pipelines.serving.bulk", "parse_args", ["--help"], 0, "usage: python -m ssd_pipelines.serving.bulk"),
        ("app.cli", "parse_args", ["--help"], 0, "usage: ssd-demo"),
    ],
)
def test_help_and_usage_errors_load_no_model_library(module, function, argv, status, says):
    parsed = parse_in_a_fresh_interpreter(module, function, argv)
    assert (parsed["status"], parsed["heavy"]) == (status, [])
    assert says in parsed["text"]


def test_the_decoding_catalog_answers_without_torch():
    """What the faces ask of the decodings before a model loads: names, options, their checks."""
    script = (
        "import sys; from ssd_pipelines.decoding import DECODINGS, check_options, option_default, options_for; "
        "check_options('ssd', verify_rounds=1); assert option_default('ssd', 'verify_rounds') == 2; "
        "assert options_for('exact', window=3, verify_rounds=1) == {'window': 3}; assert DECODINGS['gsd'].peer; "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_strategies_take_their_declarations_from_the_catalog():
    from ssd_pipelines import decoding
    from ssd_pipelines.decoding import DECODINGS, STRATEGIES, decoding_options, strategy_class

    assert list(STRATEGIES) == list(DECODINGS)
    for name, info in DECODINGS.items():
        cls = strategy_class(name)
        assert cls is STRATEGIES[name] is getattr(decoding, cls.__name__) and cls.name == name
        assert cls.__name__ in decoding.__all__
        declared = (cls.summary, cls.lossless, cls.needs_heads, cls.options)
        assert declared == (info.summary, info.lossless, info.needs_heads, info.options)
    assert decoding_options()["window"][1] == ["ssd", "exact", "auto"]


def test_the_benchmark_options_declare_every_benchmark_and_its_modules_defaults():
    from ssd_bench import BENCHMARKS, commands, scaling

    assert list(commands.PARSERS) == list(BENCHMARKS)
    assert commands.peers_parser().get_default("sides") == list(scaling.SIDES)
