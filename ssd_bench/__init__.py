"""Measurements anyone can rerun: each prints a table and writes it under docs/.

ssd-bench exactness    # TV distance to the AR distribution on an enumerable grid -> docs/exactness.md
ssd-bench reference    # adherence, Fréchet distance and speed of every decoding -> docs/reference_benchmark.md
ssd-bench sweep        # AR adherence under guidance, temperature, top-k settings -> docs/reference_sweep.md
ssd-bench peers        # SSD against AR and the published peers: speed, quality, scaling -> docs/benchmarks.md
ssd-bench window       # exact's passes, positions and seconds against its window size -> docs/exact_window.md
ssd-bench pipelined    # ssd in row blocks against ssd pipelined on the window: passes, quality -> docs/ssd_pipelined.md
ssd-bench drafters     # drafting heads against each other: acceptance, passes, Fréchet, drafting cost, targets -> docs/drafters_benchmark.md
ssd-bench recheck      # exact's re-checks: proposals for a cell after its left neighbour is redrawn -> docs/exact_recheck.md
ssd-bench serve        # ar, exact and auto on a local Ray Serve app: images/s, p50/p95 latency -> docs/serving_benchmark.md
ssd-bench gpu          # on a GPU: reference model, Janus-Pro-7B shape, costs per pass, syncs, targets -> docs/gpu.md
ssd-bench quantization # per model and precision: backbone bytes, peak memory, ar and exact -> docs/quantization_benchmark.md
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from . import commands

BENCHMARKS = {
    "exactness": "Distance to AR on an enumerable grid",
    "reference": "Reference model: adherence, speed",
    "sweep": "Reference model: AR adherence under sampling settings",
    "peers": "SSD against AR and the published peers: speed, quality, scaling",
    "window": "Reference model: exact's speed against its window size",
    "pipelined": "Reference model: ssd in row blocks against ssd pipelined, passes and quality",
    "drafters": "Reference model: drafting heads against each other, acceptance, passes and quality",
    "recheck": "Reference model: exact's re-checks, proposals after a left neighbour is redrawn",
    "serve": "Reference model on Ray Serve: throughput and latency of ar, exact and auto under load",
    "gpu": "On a GPU: reference model and Janus-Pro-7B shape, costs per pass, host syncs, issue 39's targets",
    "quantization": "Quantized backbones: bytes, peak memory, ar and exact per precision; 7B checkpoints projected",
}


def report(lines: list[str], out: Path, title: str, command: str) -> None:
    """Print a benchmark's table and write it under docs/ with the command that made it."""
    table = "\n".join(lines)
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# {title}\n\nMade by `{command}`.\n\n{table}\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHMARKS:
        listing = "\n".join(f"  {name:12s} {about}" for name, about in BENCHMARKS.items())
        raise SystemExit(f"usage: ssd-bench {{{','.join(BENCHMARKS)}}} [options]\n{listing}")
    name, options = argv[0], argv[1:]
    parser = commands.PARSERS[name]()
    parser.prog = f"ssd-bench {name}"
    parser.parse_args(options)  # --help and usage errors answer here, before torch loads
    importlib.import_module(f"{__name__}.{name}").main(options)
