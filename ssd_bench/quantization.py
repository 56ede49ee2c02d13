"""What a quantized backbone holds and costs, per model and precision side by side in one run (issue 41).

Models: the shipped reference model with its trained heads, and tiny random instances of the real transformers
classes of Janus-Pro, Emu3 and Lumina-mGPT (`tiny_published.py`, width 64 so that every linear layer suits
bitsandbytes' CPU kernels, as the real checkpoints' do) with random heads, saved like a Hub snapshot and loaded
through `from_pretrained`. Precisions: those of `precisions.py` that run on the device, each turned into
`from_pretrained`'s arguments by `quantization.precision_options`; one that cannot load is recorded with its
reason. Per row: the backbone's bytes as stored (a quantized weight's inner tensors, not its dequantized shape),
the peak memory of one call, seconds per image of `ar` and `exact`, their forward passes, `exact`'s first-round
acceptance, and whether greedy `exact` draws `ar`'s codes on that backbone. Then a projection of each published
checkpoint's backbone bytes in each precision, from its linear layers and the rest, at the bytes per weight the
runs measured.

    ssd-bench quantization            # -> docs/quantization_benchmark.md, .json and .png beside it
    ssd-bench quantization --tiny     # float32, int8 and nf4, one timed call a decoding: the tests' run, ~25 s
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch
from tqdm import tqdm

from ssd_pipelines.backbones import adapter_for
from ssd_pipelines.heads import DraftHeads
from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.precisions import PRECISIONS
from ssd_pipelines.quantization import precision_options
from ssd_pipelines.tiny_published import tiny_emu3, tiny_janus, tiny_lumina

from . import commands, report
from .measure_run import PeakMemory, release_freed_memory
from .quantization_report import markdown, plot
from .quantization_weights import projections, weight_report

TITLE = "Quantized backbones: bytes, memory and speed per precision"
TINY_WIDTH = 64  # hidden size of the tiny instances: head and MLP widths multiples of 32, as bitsandbytes' CPU needs
DECODINGS = ("ar", "exact")


@dataclass(frozen=True)
class Model:
    """One model of the run: where `from_pretrained` finds it, with what else, and how it is called."""

    label: str
    source: str
    prompt: str
    size: dict = field(default_factory=dict)  # height / width of its calls
    options: dict = field(default_factory=dict)  # from_pretrained's other arguments (heads=)
    published: str | None = None  # the checkpoint of its class the projection is for


def save_tiny(folder: Path, model, tokenizer, size: dict) -> dict:
    """Save a tiny instance as its Hub repository holds it, and random heads of its sizes beside it; returns
    `from_pretrained`'s heads option."""
    model.save_pretrained(folder / "checkpoint")
    tokenizer.save_pretrained(folder / "checkpoint")
    adapter = adapter_for(model, tokenizer)
    torch.manual_seed(1)
    grid = adapter.grid_for_size(size.get("height"), size.get("width"))
    heads = DraftHeads(adapter.hidden_size, adapter.embed_size, grid.codebook_size, base_model=None).eval()
    heads.save_pretrained(folder / "heads")
    return {"heads": str(folder / "heads")}


def models(folder: Path) -> list[Model]:
    """The reference model and the tiny published classes, 8 x 8 codes each, saved under `folder`."""
    tiny = [
        ("Janus-Pro (tiny)", "Janus-Pro-7B", tiny_janus(side=8, codebook_size=32, width=TINY_WIDTH), {}),
        ("Emu3 (tiny)", "Emu3-Gen", tiny_emu3(width=TINY_WIDTH), {"height": 16, "width": 16}),
        ("Lumina-mGPT (tiny)", "Lumina-mGPT-7B-768", tiny_lumina(width=TINY_WIDTH), {"height": 128, "width": 128}),
    ]
    found = [Model("reference", str(default_model()), "a red circle left of a blue square")]
    for label, published, (model, tokenizer), size in tiny:
        place = folder / label.split()[0]
        options = save_tiny(place, model, tokenizer, size)
        found.append(Model(label, str(place / "checkpoint"), "a red dog in the rain", size, options, published))
    return found


def precisions_on(device: torch.device, tiny: bool) -> list[str]:
    """Every precision but `auto` (the files' own dtype, one of the others), float16 only on a GPU; with `tiny`,
    float32 and the quantized ones (bfloat16 converts as float32 does, at the reference model's time again)."""
    skipped = {"auto"} | ({"float16"} if device.type == "cpu" else set()) | ({"float16", "bfloat16"} if tiny else set())
    return [name for name in PRECISIONS if name not in skipped]


def short_reason(error: Exception, model: Model) -> str:
    """An error's first sentence, naming the model by its label rather than the folder it was loaded from."""
    text = str(error).replace(f"of {model.source} ", "").replace(model.source, model.label)
    first, _, _ = text.partition(". ")
    return first.rstrip(".")


def call(pipe, model: Model, device: torch.device, **options):
    """One single-image call (codes only: the VQ decoder is not timed): its output, seconds and peak memory."""
    with PeakMemory(device) as memory:
        started = time.perf_counter()
        out = pipe(
            model.prompt, output_type="latent", generator=torch.Generator().manual_seed(0), **model.size, **options
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
    return out, seconds, memory.bytes


def greedy_check(pipe, model: Model, device: torch.device) -> dict:
    """Temperature 0: `exact` must draw `ar`'s codes, exactly, on a backbone whose logits do not depend on how many
    tokens a pass carries; where they part, the first cell that differs (row-major) and how many cells there are."""
    ar, exact = (call(pipe, model, device, decoding=d, temperature=0)[0].codes.flatten() for d in DECODINGS)
    differ = (ar != exact).nonzero()
    return {
        "greedy_exact_equals_ar": not len(differ),
        "greedy_first_difference": int(differ[0]) if len(differ) else None,
        "cells": len(ar),
    }


def timings(pipe, model: Model, device: torch.device, repeats: int) -> dict:
    """Per decoding: median seconds of `repeats` calls of one image (same seed: the same passes each call), passes,
    the largest peak memory, and `exact`'s first-round acceptance."""
    measured = {}
    for decoding in DECODINGS:
        calls = [call(pipe, model, device, decoding=decoding) for _ in range(repeats)]
        stats = calls[-1][0].stats
        peaks = [peak for _, _, peak in calls if peak is not None]
        measured[decoding] = {
            "seconds_per_image": statistics.median(seconds for _, seconds, _ in calls),
            "passes": stats["forward_passes"],
            "peak_bytes": max(peaks) if peaks else None,
            "first_round_acceptance": (stats["acceptance_per_round"] or [None])[0],
        }
    return measured


def load(model: Model, precision: str, device: torch.device):
    """The pipeline in `precision` on `device` (nf4 on a GPU is placed by bitsandbytes as it quantizes)."""
    options = precision_options(precision, str(device))
    pipe = SSDAutoregressivePipeline.from_pretrained(model.source, **model.options, **options)
    if "device_map" not in options:
        pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def measure_row(model: Model, precision: str, device: torch.device, repeats: int) -> dict:
    """One model in one precision: refused with its reason where it cannot load, else its weights (as loaded) and
    its calls, or why they failed. The greedy check's calls come first and warm the backbone for the timed ones."""
    row = {"model": model.label, "precision": precision, "published": model.published}
    try:
        pipe = load(model, precision, device)
    except ValueError as refusal:
        return {**row, "status": "refused", "reason": short_reason(refusal, model)}
    try:
        grid = pipe.image_backbone.grid_for_size(model.size.get("height"), model.size.get("width"))
        row.update(grid=[grid.rows, grid.cols], weights=weight_report(pipe.backbone))
        row.update(greedy_check(pipe, model, device))
        row["decodings"] = timings(pipe, model, device, repeats)
        row["status"] = "ran"
    except Exception as error:  # noqa: BLE001 - one row's failure must not cost the others
        traceback.print_exc()
        row.update(status="failed", reason=f"{type(error).__name__}: {short_reason(error, model)}")
    return row


def environment(device: torch.device, args, command: str) -> dict:
    """The machine, the libraries and the run's settings, for the report."""
    versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "diffusers")}
    for backend in ("torchao", "bitsandbytes"):
        try:
            versions[backend] = importlib.metadata.version(backend)
        except importlib.metadata.PackageNotFoundError:
            versions[backend] = None
    on_gpu = device.type == "cuda"
    return {
        "command": command,
        "device": torch.cuda.get_device_name(device) if on_gpu else f"CPU, {os.cpu_count()} cores, no GPU",
        "cpu_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "tiny": args.tiny,
        "tiny_width": TINY_WIDTH,
        "device_type": device.type,
        "python": platform.python_version(),
        "versions": versions,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = commands.quantization_parser().parse_args(argv)
    if args.tiny:
        args.repeats = 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    release_freed_memory()
    results = {"environment": environment(device, args, shlex.join(["ssd-bench", "quantization", *argv]))}
    results["precisions"] = precisions_on(device, args.tiny)
    with tempfile.TemporaryDirectory() as folder:
        runs = [(m, p) for m in models(Path(folder)) for p in results["precisions"]]
        rows = []
        with tqdm(total=len(runs), desc="ssd-bench quantization", unit="row") as progress:
            for model, precision in runs:
                progress.set_postfix_str(f"{model.label}, {precision}")
                rows.append(measure_row(model, precision, device, args.repeats))
                progress.update()
    results["rows"] = rows
    results["projections"] = projections(rows, results["precisions"])
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    results["plot"] = out.with_suffix(".png").name
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plot(results, out.with_suffix(".png"))
    report(markdown(results), out, TITLE, results["environment"]["command"])


if __name__ == "__main__":
    main()
