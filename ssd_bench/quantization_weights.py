"""What a quantized backbone holds: its weights' bytes as stored, what a weight of each precision costs, and the
published checkpoints' bytes projected from them (`ssd-bench quantization`, and the 7B shape of `ssd-bench gpu`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from transformers import (
    ChameleonForConditionalGeneration,
    Emu3ForConditionalGeneration,
    JanusForConditionalGeneration,
    JanusVisionConfig,
)

from ssd_pipelines.precisions import PRECISIONS, compute_dtype

from .backbone_speed import emu3_gen_config, janus_pro_config, lumina_mgpt_config

GPU_SIZES_GIB = (8, 12)  # the cards the projection is held against, weights alone
GIB = 2**30


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
