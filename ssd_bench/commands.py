"""The options of every benchmark, declared apart from its module: `ssd-bench NAME --help` and a usage error answer
from here, before the benchmark's module imports torch, diffusers or transformers.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)  # peers' speed run
SIDES = [8, 16, 24, 32]  # peers' scaling run: scaling.SIDES, which imports torch
SERVE_DECODINGS = ("ar", "exact", "auto")
CLIENTS = (1, 2, 4, 8, 16)
REPLICAS = (1, 2)
GPU_SECTIONS = "ABCEQ"  # what `ssd-bench gpu --sections` takes (gpu.SHARES); D and F follow from what ran
SETTING_TYPES = {"guidance": float, "temperature": float, "top_k": int}  # of `ssd-bench sweep --setting`


def gpu_sections(text: str) -> str:
    """`--sections` of `ssd-bench gpu`: letters of GPU_SECTIONS, each once."""
    if not text or set(text) - set(GPU_SECTIONS) or len(set(text)) != len(text):
        raise argparse.ArgumentTypeError(f"letters of {GPU_SECTIONS}, each once, got {text!r}")
    return text


def sweep_setting(text: str) -> dict:
    """Parse "guidance=5,top_k=50" into {"guidance": 5.0, "temperature": 1.0, "top_k": 50}; unset keys keep defaults."""
    setting = {"guidance": 3.0, "temperature": 1.0, "top_k": 0}
    for item in text.split(","):
        key, _, value = item.partition("=")
        try:
            setting[key.strip()] = SETTING_TYPES[key.strip()](value)
        except (KeyError, ValueError):
            raise argparse.ArgumentTypeError(
                f"bad setting {item!r} in {text!r}: write key=value with keys {', '.join(SETTING_TYPES)}"
            ) from None
    return setting


def add_reference_renders(parser: argparse.ArgumentParser) -> None:
    """The option of every benchmark that measures a Fréchet distance: how many real renders it compares with."""
    parser.add_argument(
        "--reference-renders", type=int, default=1000, help="real renders the Fréchet distance compares with"
    )


def exactness_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="How close each strategy's samples are to the AR distribution, on a grid small enough to enumerate."
    )
    parser.add_argument("--samples", type=int, default=100_000, help="grids drawn per strategy (one batch)")
    parser.add_argument("--guidance", type=float, default=2.0, help="classifier-free guidance scale")
    parser.add_argument("--out", type=Path, default=Path("docs/exactness.md"), help="where the table is written")
    return parser


def reference_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Adherence and speed of each decoding on the reference model, side by side in one run."
    )
    parser.add_argument("--model", default=None, help="pipeline folder or repository (default: the reference model)")
    parser.add_argument("--prompts", type=int, default=200, help="held-out prompts scored per decoding")
    parser.add_argument("--images-per-prompt", type=int, default=4, help="images scored per prompt (GenEval: 4)")
    parser.add_argument("--batch-size", type=int, default=100, help="images per pipeline call")
    parser.add_argument("--repeats", type=int, default=5, help="single-image timings per decoding (median)")
    parser.add_argument("--guidance", type=float, default=3.0)
    add_reference_renders(parser)
    parser.add_argument("--out", type=Path, default=Path("docs/reference_benchmark.md"))
    return parser


def sweep_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="AR adherence of the reference model under several sampling settings, side by side."
    )
    parser.add_argument(
        "--model", action="append", help="pipeline folder or repository, repeatable (default: the reference model)"
    )
    parser.add_argument(
        "--setting",
        action="append",
        type=sweep_setting,
        help="key=value[,key=value] of guidance, temperature, top_k; repeatable",
    )
    parser.add_argument("--prompts", type=int, default=200, help="held-out prompts scored per setting")
    parser.add_argument("--images-per-prompt", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=100, help="images per pipeline call")
    add_reference_renders(parser)
    parser.add_argument("--out", type=Path, default=Path("docs/reference_sweep.md"))
    return parser


def peers_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "SSD against AR and the published peers, in one run on the reference model: speed, quality and scaling."
        )
    )
    parser.add_argument("--model", default=None, help="pipeline folder or repository (default: the reference model)")
    parser.add_argument("--prompts", type=int, default=48, help="held-out prompts in the quality run")
    parser.add_argument("--images-per-prompt", type=int, default=2)
    parser.add_argument("--quality-batch", type=int, default=16, help="images per call in the quality run")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per strategy up to batch 8 (median)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--sides", type=int, nargs="+", default=list(SIDES), help="grid sides of the scaling run")
    add_reference_renders(parser)
    parser.add_argument("--guidance", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--note", default="", help="what else ran on the machine, for the report")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    return parser


def window_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="`exact`'s window size: forward passes, positions processed and seconds, at batch 1 and batch 8."
    )
    parser.add_argument("--model", default=None, help="pipeline folder or repository (default: the reference model)")
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts (batch 8 uses them in groups)")
    parser.add_argument("--windows", type=int, nargs="+", default=None, help="positions (default: 4 to 8 rows)")
    parser.add_argument("--guidance", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier beside other work)")
    parser.add_argument("--out", type=Path, default=Path("docs/exact_window.md"))
    return parser


def pipelined_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "`ssd` in the paper's row blocks against `ssd` pipelined on `exact`'s sliding window: passes against "
            "quality."
        )
    )
    parser.add_argument("--model", default=None, help="pipeline folder or repository (default: the reference model)")
    parser.add_argument("--prompts", type=int, default=48, help="held-out prompts in the quality run")
    parser.add_argument("--images-per-prompt", type=int, default=2)
    parser.add_argument("--windows", type=int, nargs="+", default=None, help="positions (default: one row)")
    parser.add_argument("--repeats", type=int, default=8, help="single-image timed calls per decoding")
    add_reference_renders(parser)
    parser.add_argument("--guidance", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier beside other work)")
    parser.add_argument("--out", type=Path, default=Path("docs/ssd_pipelined.md"))
    return parser


def drafters_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "Drafting heads against each other on the reference backbone: the ablation of the drafter and its training."
        )
    )
    parser.add_argument("--model", default=None, help="pipeline whose backbone drafts (default: the reference model)")
    parser.add_argument("--heads", action="append", required=True, help="LABEL=FOLDER of heads; repeat to compare")
    parser.add_argument("--prompts", type=int, default=200, help="held-out prompts scored per decoding")
    parser.add_argument("--images-per-prompt", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=100, help="images per pipeline call")
    parser.add_argument("--repeats", type=int, default=5, help="single-image timings per decoding (median)")
    parser.add_argument("--guidance", type=float, default=3.0)
    add_reference_renders(parser)
    parser.add_argument("--out", type=Path, default=Path("docs/drafters_benchmark.md"))
    return parser


def recheck_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ssd-bench recheck",
        description=(
            "`exact`'s re-checks: which proposal a cell should carry after the cell to its left was resampled."
        ),
    )
    parser.add_argument("--model", default=None, help="pipeline folder or repository (default: the reference model)")
    parser.add_argument("--heads", action="append", required=True, help="LABEL=FOLDER of in-row heads; repeat")
    parser.add_argument("--prompts", type=int, default=50, help="held-out prompts, one AR image each")
    parser.add_argument("--cells", type=int, default=8, help="cells per image whose left neighbour is redrawn")
    parser.add_argument("--exact-prompts", type=int, default=20, help="held-out prompts `exact` decodes per row")
    parser.add_argument("--guidance", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path("docs/exact_recheck.md"))
    return parser


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "Serving under load: throughput and latency of `ar`, `exact` and `auto` on a local Ray Serve app, 1 and 2 "
            "replicas."
        )
    )
    parser.add_argument("--model", default=None, help="pipeline folder or repository (default: the reference model)")
    parser.add_argument("--replicas", type=int, nargs="+", default=list(REPLICAS))
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="concurrent clients, per level")
    parser.add_argument("--decodings", nargs="+", default=list(SERVE_DECODINGS))
    parser.add_argument("--requests", type=int, default=16, help="requests per load level (at least one a client)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (and Ray CPUs) per replica")
    parser.add_argument(
        "--exact-max-batch", default="measure", help="auto's crossover on the servers: N or 'measure' (default)"
    )
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-wait-timeout-s", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=120, help="seconds one request may take")
    parser.add_argument("--note", default="", help="what else ran on the machine, for the report")
    parser.add_argument("--out", type=Path, default=Path("docs/serving_benchmark.md"))
    return parser


def gpu_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "The GPU measurement of issue 39 in one command: what the decodings cost on a GPU, and how far from the "
            "targets."
        )
    )
    parser.add_argument("--tiny", action="store_true", help="run on the CPU: a tiny Janus, fewer repeats, 2 images")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="folder of gpu.md and gpu.json")
    parser.add_argument("--deadline", type=float, default=540, help="seconds for every section together")
    parser.add_argument(
        "--sections",
        type=gpu_sections,
        default="ABCE",
        help="of A, B, C, E (D and F follow from what ran), and Q, the 7B shape in int8 and nf4, not by default",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of a --tiny run (1: steadier beside other work)"
    )
    return parser


def quantization_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "Quantized backbones side by side: bytes, peak memory, seconds and passes of ar and exact per model and "
            "precision, and the published checkpoints' weights projected."
        )
    )
    parser.add_argument(
        "--tiny", action="store_true", help="float32, int8 and nf4, one timed call a decoding: the tests' run"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed single-image calls per decoding (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier beside other work)")
    parser.add_argument(
        "--out", type=Path, default=Path("docs/quantization_benchmark.md"), help="the table; .json and .png beside it"
    )
    return parser


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "exactness": exactness_parser,
    "reference": reference_parser,
    "sweep": sweep_parser,
    "peers": peers_parser,
    "window": window_parser,
    "pipelined": pipelined_parser,
    "drafters": drafters_parser,
    "recheck": recheck_parser,
    "serve": serve_parser,
    "gpu": gpu_parser,
    "quantization": quantization_parser,
}
