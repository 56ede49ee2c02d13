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
import math
import os
import platform
import re
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
from transformers import (
    ChameleonForConditionalGeneration,
    Emu3ForConditionalGeneration,
    JanusForConditionalGeneration,
    JanusVisionConfig,
)

from ..backbones import adapter_for
from ..heads import DraftHeads
from ..hub import default_model
from ..pipeline_ssd import SSDAutoregressivePipeline
from ..plots import pyplot
from ..precisions import PRECISIONS, compute_dtype
from ..quantization import precision_options
from ..tiny_published import tiny_emu3, tiny_janus, tiny_lumina
from . import commands, report
from .backbone_speed import emu3_gen_config, janus_pro_config, lumina_mgpt_config
from .measure_run import PeakMemory, release_freed_memory

TITLE = "Quantized backbones: bytes, memory and speed per precision"
TINY_WIDTH = 64  # hidden size of the tiny instances: head and MLP widths multiples of 32, as bitsandbytes' CPU needs
GPU_SIZES_GIB = (8, 12)  # the cards the projection is held against, weights alone
DECODINGS = ("ar", "exact")
COLUMNS = 11  # of the table's rows
MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class Model:
    """One model of the run: where `from_pretrained` finds it, with what else, and how it is called."""

    label: str
    source: str
    prompt: str
    size: dict = field(default_factory=dict)  # height / width of its calls
    options: dict = field(default_factory=dict)  # from_pretrained's other arguments (heads=)
    published: str | None = None  # the checkpoint of its class the projection is for


@dataclass(frozen=True)
class Published:
    """A published checkpoint's shape on the meta device, for the projection."""

    name: str
    model_class: type
    config: object


def published_checkpoints() -> list[Published]:
    """The three published checkpoints' shapes (their config.json values, docs/backbones.md). Janus-Pro-7B keeps
    its SigLIP-L vision tower (transformers' defaults), which generation never runs but the checkpoint holds, and
    an output head apart from its embeddings, as deepseek-llm-7b has (its checkpoint holds some 15 GB in bf16)."""
    janus = janus_pro_config()
    janus.vision_config, janus.tie_word_embeddings = JanusVisionConfig(), False
    return [
        Published("Janus-Pro-7B", JanusForConditionalGeneration, janus),
        Published("Emu3-Gen", Emu3ForConditionalGeneration, emu3_gen_config()),
        Published("Lumina-mGPT-7B-768", ChameleonForConditionalGeneration, lumina_mgpt_config()),
    ]


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


def storage_bytes(tensor: torch.Tensor, seen: set[int]) -> int:
    """Bytes `tensor` really stores, each storage counted once: a tensor subclass (torchao's) by its inner tensors,
    since numel * element_size counts its dequantized shape."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(storage_bytes(getattr(tensor, name), seen) for name in names)
    storage = tensor.untyped_storage()
    if storage.data_ptr() in seen:
        return 0
    seen.add(storage.data_ptr())
    return storage.nbytes()


def side_tensors(weight: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What a quantized weight keeps beside its codes: one entry a scale block (torchao's scales and zero points,
    bitsandbytes' absmax), and a fixed size a layer (bitsandbytes' code book of 16 levels)."""
    if hasattr(weight, "__tensor_flatten__"):
        names, _ = weight.__tensor_flatten__()
        return [getattr(weight, name) for name in names if name != "qdata"], []
    return [weight.quant_state.absmax], [weight.quant_state.code]


def block_of(weight: torch.Tensor, in_features: int) -> int | str:
    """How many weights share one scale: "row" where each output row has its own whatever its width (torchao's
    int8 weight-only: block [1, in_features]), else the block size (bitsandbytes' 4-bit: 64)."""
    if not hasattr(weight, "__tensor_flatten__"):
        return weight.quant_state.blocksize
    _, context = weight.__tensor_flatten__()
    block = math.prod(context["block_size"])
    return "row" if context["block_size"][-1] == block == in_features else block


def layer_pattern(name: str) -> str:
    """A module's name with its indices as N: the same layer of a model of another depth."""
    return re.sub(r"\.\d+(?=\.|$)", ".N", name)


def is_quantized(parameter: torch.Tensor) -> bool:
    return hasattr(parameter, "__tensor_flatten__") or hasattr(parameter, "quant_state")


def quantized_layer(module: torch.nn.Module, seen: set[int]) -> dict:
    """One quantized linear layer's bytes: its codes, the side tensors with one entry a scale block (scales, zero
    points, absmax), and those of a fixed size (bitsandbytes' code book of 16 levels)."""
    weight, weights = module.weight, module.in_features * module.out_features
    block = block_of(weight, module.in_features)
    blocks = -(-weights // (module.in_features if block == "row" else block))  # a last block may be partial
    per_block, per_layer = side_tensors(weight)
    block_bytes = sum(storage_bytes(t, seen) for t in per_block)
    layer_bytes = sum(storage_bytes(t, seen) for t in per_layer)
    codes = storage_bytes(weight, seen)  # what is left unseen once the side tensors are counted
    return {
        "weights": weights,
        "code_bytes": codes,
        "block_bytes": block_bytes,
        "layer_bytes": layer_bytes,
        "blocks": blocks,
        "block": block,
    }


def weight_report(model: torch.nn.Module) -> dict:
    """The backbone's parameters and bytes as stored, and the sums over its quantized linear layers, with their
    block (the weights a scale covers) and which layers they are."""
    seen: set[int] = set()
    layers, total = {}, 0
    for name, module in model.named_modules():
        parameters = dict(module.named_parameters(recurse=False))
        if "weight" in parameters and is_quantized(parameters["weight"]):
            layers[name] = quantized_layer(module, seen)
            total += sum(layers[name][key] for key in ("code_bytes", "block_bytes", "layer_bytes"))
            parameters.pop("weight")
        total += sum(storage_bytes(p, seen) for p in parameters.values())
    report = {"bytes": total, "parameters": sum(p.numel() for p in model.parameters()), "quantized": None}
    if layers:
        keys = ("weights", "code_bytes", "block_bytes", "layer_bytes", "blocks")
        report["quantized"] = {key: sum(layer[key] for layer in layers.values()) for key in keys} | {
            "count": len(layers),
            "block": next(iter(layers.values()))["block"],
            "layers": sorted({layer_pattern(name) for name in layers}),
        }
    return report


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


def bytes_per_weight(quantized: dict) -> dict:
    """What carries over from a quantized run to another shape: code bytes a weight, side bytes a scale block (int8
    keeps one scale an output row, nf4 one per 64 weights) and fixed bytes a layer."""
    return {
        "code_bytes_per_weight": quantized["code_bytes"] / quantized["weights"],
        "side_bytes_per_block": quantized["block_bytes"] / quantized["blocks"],
        "bytes_per_layer": quantized["layer_bytes"] / quantized["count"],
        "block": quantized["block"],
        "layers": quantized["layers"],
    }


def quantized_bytes(module: torch.nn.Module, measured: dict) -> float:
    """A linear layer's bytes at the rates a run measured."""
    weights = module.in_features * module.out_features
    block = module.in_features if measured["block"] == "row" else measured["block"]
    return (
        weights * measured["code_bytes_per_weight"]
        + weights / block * measured["side_bytes_per_block"]
        + measured["bytes_per_layer"]
    )


def project(model: torch.nn.Module, precision: str, measured: dict | None) -> dict:
    """A published checkpoint's backbone bytes in `precision` on a GPU: the layers the run of its class quantized,
    at the rates that run measured; every other weight in the compute dtype (bfloat16 for int8 and nf4)."""
    rest_bytes = getattr(torch, compute_dtype(precision, "cuda")).itemsize
    layers = set(measured["layers"]) if measured else set()
    total, quantized, seen = 0.0, 0, set()
    for name, module in model.named_modules():
        for key, parameter in module.named_parameters(recurse=False):
            if id(parameter) in seen:  # a tied weight, once
                continue
            seen.add(id(parameter))
            if key == "weight" and layer_pattern(name) in layers:
                total += quantized_bytes(module, measured)
                quantized += parameter.numel()
            else:
                total += parameter.numel() * rest_bytes
    gib = total / GIB
    return {
        "precision": precision,
        "parameters": sum(p.numel() for p in model.parameters()),
        "quantized_weights": quantized,
        "gib": gib,
        **{f"fits_{size}gib": gib <= size for size in GPU_SIZES_GIB},
    }


def projections(rows: list[dict], precisions: list[str]) -> list[dict]:
    """Each published checkpoint in each precision; a quantized one where the run of its class loaded (its weights
    are measured at load, so a run that failed later still counts)."""
    found = []
    for shape in published_checkpoints():
        with torch.device("meta"):
            model = shape.model_class(shape.config)
        # the layers a GPU quantizes: every backend's on this class (a CPU may keep some out: fit_nf4_to_cpu)
        runs = [r for r in rows if r["published"] == shape.name and r.get("weights") and r["weights"]["quantized"]]
        on_gpu = sorted(set().union(*(r["weights"]["quantized"]["layers"] for r in runs)))
        for precision in precisions:
            run = next((r for r in rows if r["published"] == shape.name and r["precision"] == precision), None)
            quantized = run and run.get("weights") and run["weights"]["quantized"]
            if PRECISIONS[precision].backend and not quantized:
                found.append({"checkpoint": shape.name, "precision": precision, "gib": None})
                continue
            measured = {**bytes_per_weight(quantized), "layers": on_gpu} if quantized else None
            found.append({"checkpoint": shape.name, **project(model, precision, measured)})
    return found


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
        "device_type": device.type,
        "python": platform.python_version(),
        "versions": versions,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def mib(count: int | None) -> str:
    return "-" if count is None else f"{count / MIB:.2f}"


def greedy_cell(row: dict) -> str:
    if row["greedy_exact_equals_ar"]:
        return "yes"
    return f"**no**: from cell {row['greedy_first_difference']} of {row['cells']}"


def row_line(row: dict, float32: dict | None) -> str:
    """One row of the table: a refused one says why; one that failed after loading gives its bytes and why."""
    cells = [row["model"], row["precision"]]
    weights = row.get("weights")
    if weights:
        ratio = f"{weights['bytes'] / float32['weights']['bytes']:.2f}x" if float32 else "-"
        cells += [mib(weights["bytes"]), ratio]
    if row["status"] != "ran":
        cells.append(f"**{row['status']}**: {row['reason']}")
        return "| " + " | ".join(cells + [""] * (COLUMNS - len(cells))) + " |"
    ar, exact = row["decodings"]["ar"], row["decodings"]["exact"]
    acceptance = exact["first_round_acceptance"]
    cells += [
        f"{mib(ar['peak_bytes'])} / {mib(exact['peak_bytes'])}",
        f"{ar['seconds_per_image']:.3f}",
        f"{exact['seconds_per_image']:.3f}",
        f"{ar['seconds_per_image'] / exact['seconds_per_image']:.2f}x",
        f"{ar['passes']} / {exact['passes']}",
        "-" if acceptance is None else f"{acceptance:.2f}",
        greedy_cell(row),
    ]
    return "| " + " | ".join(cells) + " |"


def bytes_line(row: dict) -> str | None:
    """What one weight of a quantized run's linear layers took: codes, scales, and both with the fixed bytes."""
    quantized = (row.get("weights") or {}).get("quantized")
    if not quantized:
        return None
    per = bytes_per_weight(quantized)
    block = "output row" if per["block"] == "row" else f"{per['block']} weights"
    fixed = f" + {per['bytes_per_layer']:.0f} a layer" if per["bytes_per_layer"] else ""
    stored = quantized["code_bytes"] + quantized["block_bytes"] + quantized["layer_bytes"]
    return (
        f"| {row['model']} | {row['precision']} | {quantized['weights'] / row['weights']['parameters']:.0%} | "
        f"{per['code_bytes_per_weight']:.3f} | {per['side_bytes_per_block']:.1f} per {block}{fixed} | "
        f"{stored / quantized['weights']:.3f} |"
    )


def projection_line(p: dict) -> str:
    if p["gib"] is None:
        return f"| {p['checkpoint']} | {p['precision']} | not measured (the run of its class did not load) | | |"
    fits = ["yes" if p[f"fits_{size}gib"] else "no" for size in GPU_SIZES_GIB]
    share = p["quantized_weights"] / p["parameters"]
    quantized = f" ({share:.0%} of {p['parameters'] / 1e9:.2f} B weights quantized)" if share else ""
    return f"| {p['checkpoint']} | {p['precision']} | {p['gib']:.2f}{quantized} | {fits[0]} | {fits[1]} |"


def how_measured(env: dict) -> list[str]:
    """What the run loaded and how each column was measured."""
    on_gpu = env["device_type"] == "cuda"
    peak = (
        "`torch.cuda.max_memory_allocated` after a reset"
        if on_gpu
        else (
            "on this CPU the process's peak resident set (`VmHWM`), restarted before the call through "
            "`/proc/self/clear_refs`, with glibc returning freed blocks above 64 KiB to the system "
            "(`PeakMemory` of `ssd_pipelines/benchmarks/measure_run.py`)"
        )
    )
    noise = (
        "Synchronized after each call."
        if on_gpu
        else "CPU timings are noisy: compare ratios within this run, not with other runs."
    )
    return [
        (
            f"Machine: {env['device']}, {env['cpu_threads']} torch thread(s); torch {env['versions']['torch']}, "
            f"transformers {env['versions']['transformers']}, diffusers {env['versions']['diffusers']}, torchao "
            f"{env['versions']['torchao']}, bitsandbytes {env['versions']['bitsandbytes']}; started "
            f"{env['started']}. The same figures as JSON beside this file (`.json`), and the plot (`.png`)."
        ),
        "",
        (
            "Each model is loaded with `SSDAutoregressivePipeline.from_pretrained(..., **precision_options(name, "
            "device))` (`ssd_pipelines/quantization.py`): a float precision converts every component; int8 "
            "(torchao, weight-only) and nf4 (bitsandbytes) quantize the backbone's linear layers and compute in "
            f"{compute_dtype('int8', env['device_type'])} here. The tiny models are random instances of the "
            "published classes (hidden size "
            f"{TINY_WIDTH}, 8 x 8 codes, random heads, so their acceptance means nothing); the reference model has "
            "its trained heads. One image a call, the model's default guidance, codes only "
            '(`output_type="latent"`: the VQ decoder is not run).'
        ),
        "",
        (
            "- **backbone MiB**: the backbone's parameters as stored, each storage once: a torchao weight by its "
            "inner tensors (int8 codes, scales, zero points), a bitsandbytes one by its packed codes and its "
            "quant_state (absmax, code book); `numel * element_size` would count their dequantized shape."
        ),
        (
            "- **peak MiB**: what one call allocated above what was live before it, the larger of its timed calls: "
            f"{peak}. The tiny models' calls allocate too little for this to resolve."
        ),
        (
            f"- **s / image**: wall seconds of one call, median of {env['repeats']} with the same seed (the same "
            f"passes each time), after the greedy check's two calls warmed the backbone. {noise}"
        ),
        (
            '- **passes**: forward passes (`out.stats["forward_passes"]`); `ar` takes one a code. **acceptance**: '
            '`exact`\'s first-round acceptance (`out.stats["acceptance_per_round"][0]`).'
        ),
        (
            "- **greedy exact == ar**: at temperature 0, `exact`'s codes against `ar`'s on the same backbone: "
            "`exact` is lossless with respect to the backbone it runs on, quantized or not."
        ),
        "",
    ]


def rows_table(rows: list[dict]) -> list[str]:
    """One row per model and precision."""
    float32 = {r["model"]: r for r in rows if r["precision"] == "float32" and r.get("weights")}
    return [
        (
            "| model | precision | backbone MiB | vs float32 | peak MiB ar / exact | s / image ar | s / image exact | "
            "exact's speedup | passes ar / exact | acceptance | greedy exact == ar |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(row_line(r, float32.get(r["model"])) for r in rows),
        "",
    ]


def bytes_table(rows: list[dict]) -> list[str]:
    """What one weight of the quantized linear layers took, as loaded."""
    return [
        (
            "The quantized linear layers as loaded: the share of the backbone's weights they hold, their codes' "
            "bytes a weight, the bytes kept beside them per block of weights sharing a scale (scales and zero "
            "points, or absmax) and per layer (bitsandbytes' code book), and all together a weight. On a CPU with "
            "AVX512-BF16, bitsandbytes repacks a 4-bit layer at its first call and keeps its absmax in bfloat16 "
            "from then on (2 bytes a block instead of 4); the figures here are those of the loaded model, which a "
            "GPU keeps."
        ),
        "",
        "| model | precision | share of weights | code bytes / weight | side bytes | bytes / weight |",
        "|---|---|---|---|---|---|",
        *filter(None, (bytes_line(r) for r in rows)),
        "",
    ]


def projection_table(projected: list[dict]) -> list[str]:
    sizes = " and ".join(f"{size} GiB" for size in GPU_SIZES_GIB)
    return [
        "## Projection to the published checkpoints (not measured)",
        "",
        (
            "**A projection, not a measurement**: no real checkpoint was loaded. Each checkpoint's shape is built "
            "on the meta device from its config (Janus-Pro-7B with its SigLIP-L vision tower and an output head "
            "apart from its embeddings). The layers its class's tiny runs quantized (every linear layer but the "
            "output head `lm_head`, as on a GPU, where nf4 keeps none out as it may on a CPU) take the bytes each "
            "precision's run measured a weight and a scale block (an int8 block is a row of each layer); every other "
            "weight (embeddings, output head, norms, convolutions) stays in the "
            "compute dtype a GPU uses, bfloat16. The side bytes are the CPU run's (float32 scales: a GPU's "
            f"bfloat16 ones take a little less). Weights alone, against cards of {sizes}: the key/value cache, "
            "activations and the CUDA context come on top (docs/backbones.md gives the cache per image)."
        ),
        "",
        f"| checkpoint | precision | weights GiB (projected) | fits {GPU_SIZES_GIB[0]} GiB | "
        + f"fits {GPU_SIZES_GIB[1]} GiB |",
        "|---|---|---|---|---|",
        *(projection_line(p) for p in projected),
    ]


def half_precision(precision: str, device_type: str) -> bool:
    """Whether the passes round to half precision: a half dtype, or nf4 on a CPU with AVX512-BF16, whose
    bitsandbytes kernels compute in bfloat16."""
    if precision == "nf4" and device_type == "cpu":
        from bitsandbytes.functional import has_avx512bf16

        return has_avx512bf16()
    return compute_dtype(precision, device_type) in ("bfloat16", "float16")


def notes(rows: list[dict], device_type: str) -> list[str]:
    """What the table's exceptions mean: greedy `exact` parting from `ar`, and rows that failed after loading."""
    parted = [r for r in rows if r.get("greedy_exact_equals_ar") is False]
    half = [f"{r['model']} in {r['precision']}" for r in parted if half_precision(r["precision"], device_type)]
    other = [f"{r['model']} in {r['precision']}" for r in parted if not half_precision(r["precision"], device_type)]
    lines = []
    if half:
        lines += [
            (
                f"Greedy `exact` parts from greedy `ar` on {', '.join(half)}, which compute in half precision (on a "
                "CPU with AVX512-BF16, bitsandbytes' kernels run nf4 layers in bfloat16). "
                "`exact` is lossless with respect to a backbone whose logits for a cell do not depend on how many "
                "tokens a pass carries, and in half precision they do: a pass over one token (`ar`) and a pass over "
                "a window (`exact`) sum in different orders and round to 8 bits of mantissa, so where a cell's two "
                "best codes lie within a rounding step of each other the two passes may rank them differently, and "
                "the grids part from that cell on (`ssd-bench gpu` checks greedy agreement in float32 for this "
                "reason)."
            ),
            "",
        ]
    if other:
        lines += [f"**Greedy `exact` parts from greedy `ar` on {', '.join(other)}, in full precision: a bug.**", ""]
    if device_type == "cpu" and half_precision("nf4", device_type) and any(r["precision"] == "nf4" for r in rows):
        lines += [
            (
                "On this CPU (AVX512-BF16), nf4 keeps in float32 the linear layers that bitsandbytes' kernels cannot "
                "repack, those not a multiple of 32 wide or whose input is not a multiple of 64: the reference "
                "model's MLPs, 688 wide (`quantization.fit_nf4_to_cpu`, which warns). The bytes table below gives "
                "the share of each backbone's weights that went to 4 bits."
            ),
            "",
        ]
    if any(r["status"] == "failed" for r in rows):
        lines += [
            (
                "A row that **failed** loaded (its bytes are given, and count in the projection) and raised at its "
                "first call."
            ),
            "",
        ]
    return lines


def markdown(results: dict) -> list[str]:
    """The file below its title and command: the machine and method, the plot, the tables."""
    plot_line = f"![backbone bytes and seconds against float32, and the checkpoints projected]({results['plot']})"
    return [
        *how_measured(results["environment"]),
        plot_line,
        "",
        *rows_table(results["rows"]),
        *notes(results["rows"], results["environment"]["device_type"]),
        *bytes_table(results["rows"]),
        *projection_table(results["projections"]),
    ]


COLOURS = {
    "float32": "tab:gray",
    "float16": "tab:olive",
    "bfloat16": "tab:blue",
    "int8": "tab:orange",
    "nf4": "tab:green",
}


def plot(results: dict, path: Path) -> None:
    """Three panels: backbone bytes and `exact`'s seconds per image against the same model's float32, per
    precision; the published checkpoints' projected GiB against the cards' sizes. One legend for all three."""
    plt = pyplot()
    from matplotlib.patches import Patch  # only once a figure is being drawn: matplotlib is optional

    precisions = results["precisions"]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    measured = [
        ("weights", lambda r: r["weights"]["bytes"], "backbone bytes / float32's (measured)"),
        ("decodings", lambda r: r["decodings"]["exact"]["seconds_per_image"], "exact's s / image / float32's"),
    ]
    for ax, (needs, value, title) in zip(axes, measured):
        plot_against_float32(ax, results["rows"], precisions, needs, value)
        ax.set_title(title, fontsize=10)
    plot_projection(axes[2], results["projections"], precisions)
    handles = [Patch(color=COLOURS[precision], label=precision) for precision in precisions]
    figure.legend(handles=handles, loc="upper center", ncol=len(precisions), fontsize=9, frameon=False)
    figure.suptitle(results["environment"]["device"], x=0.01, ha="left", fontsize=9)
    figure.tight_layout(rect=(0, 0, 1, 0.93))
    figure.savefig(path, dpi=90)
    plt.close(figure)


def plot_against_float32(ax, rows: list[dict], precisions: list[str], needs: str, value) -> None:
    """Bars of `value` over the same model's float32 one, grouped by model; a row without it says its status."""
    labels = list(dict.fromkeys(r["model"] for r in rows))
    by = {(r["model"], r["precision"]): r for r in rows}
    width = 0.8 / len(precisions)
    for i, precision in enumerate(precisions):
        for j, label in enumerate(labels):
            row, base = by.get((label, precision)), by.get((label, "float32"))
            x = j + (i - (len(precisions) - 1) / 2) * width
            if row and needs in row and base and needs in base:
                ax.bar(x, value(row) / value(base), width, color=COLOURS[precision])
            elif row:
                ax.text(x, 0.02, row["status"], rotation=90, ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(labels)), [label.replace(" (tiny)", "\n(tiny)") for label in labels], fontsize=8)


def plot_projection(ax, projected: list[dict], precisions: list[str]) -> None:
    """The published checkpoints' projected weights per precision, with the GPU sizes as lines."""
    names = list(dict.fromkeys(p["checkpoint"] for p in projected))
    width = 0.8 / len(precisions)
    for i, precision in enumerate(precisions):
        for j, name in enumerate(names):
            p = next(p for p in projected if (p["checkpoint"], p["precision"]) == (name, precision))
            if p["gib"] is not None:
                ax.bar(j + (i - (len(precisions) - 1) / 2) * width, p["gib"], width, color=COLOURS[precision])
    for size in GPU_SIZES_GIB:
        ax.axhline(size, color="black", linestyle="--", linewidth=0.8)
        ax.text(len(names) - 0.5, size, f"{size} GiB", ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("GiB", fontsize=8)
    ax.set_title("published checkpoints: weights, projected", fontsize=10)


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
