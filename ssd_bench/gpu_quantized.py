"""Section Q of `ssd-bench gpu` (issue 41): Janus-Pro-7B's shape with its language model quantized, beside bfloat16.

For each precision: the 7B shape is built with random weights, the language model's linear layers are quantized
in place as `from_pretrained(..., quantization_config=...)` would load them (torchao's int8 weight-only;
bitsandbytes' 4-bit NormalFloat, computing in the model's dtype), and one image's passes are timed as section B
times bfloat16's (`backbone_speed.measure`: prefill, 1-token pass, 24-token row pass, the heads' row). On CUDA it
gives the memory the weights hold, the peak of those passes on top, and whether that fits in 8 GiB and in
12 GiB (the CUDA context, some 0.5 GiB, comes on top of allocated memory).

Not a default section (`ssd-bench gpu --sections Q`): it builds the 7B shape once per precision, about a minute
each on an H200. `--tiny` runs it on the CPU, in float32.
"""

from __future__ import annotations

import gc

import torch
from torch import nn

from ssd_pipelines.precisions import check_precision

from . import backbone_speed as bs
from .quantization_weights import weight_report

CARDS_GIB = (8, 12)
QUANTIZED = ("int8", "nf4")


def quantize_linears(module: nn.Module, precision: str, compute_dtype: torch.dtype) -> None:
    """Every linear layer of `module`, in place, in `precision`."""
    if precision == "int8":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(module, Int8WeightOnlyConfig(set_inductor_config=False))
        return
    import bitsandbytes as bnb

    for name, child in list(module.named_children()):
        if not isinstance(child, nn.Linear):
            quantize_linears(child, precision, compute_dtype)
            continue
        layer = bnb.nn.Linear4bit(
            child.in_features,
            child.out_features,
            bias=child.bias is not None,
            compute_dtype=compute_dtype,
            quant_type="nf4",
            device="meta",
        )
        layer.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4")
        if child.bias is not None:
            layer.bias = child.bias
        setattr(module, name, layer.to(child.weight.device))  # bitsandbytes quantizes as it places


def measure_precision(precision: str, device: torch.device, tiny: bool, prompt_tokens: int, repeats: int) -> dict:
    """One precision's row: refused with the reason where this machine cannot run it, else its memory and passes."""
    row = {"precision": precision}
    try:
        check_precision(precision, device.type)
    except ValueError as refusal:
        return {**row, "status": "refused", "reason": str(refusal)}
    dtype = torch.float32 if tiny else torch.bfloat16
    backbone, heads = bs.build(bs.janus_pro_config(tiny), device, dtype)
    if precision in QUANTIZED:
        quantize_linears(backbone.model.model.language_model, precision, dtype)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        weights_gib = torch.cuda.memory_allocated(device) / 2**30  # the backbone and its heads, nothing else lives
    seconds = bs.measure(backbone, heads, 1, prompt_tokens, repeats)
    row.update(status="ran", weight_bytes=weight_report(backbone.model)["bytes"], seconds=seconds)
    row["row_per_token_pass"] = seconds["row_pass"] / seconds["ar_step"]
    if on_gpu:
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        row.update(allocated_gib=weights_gib, peak_gib=peak, **{f"fits_{gib}gib": peak <= gib for gib in CARDS_GIB})
    del backbone, heads
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return row


def quantized_section(run, res: dict) -> None:
    """Q: each precision in turn, inside the section's time box; B's model is let go first, so that what is
    allocated is each precision's own."""
    run.janus = None
    gc.collect()
    repeats = 3 if run.tiny else 10
    res["rows"] = []
    for precision in ("float32" if run.tiny else "bfloat16", *QUANTIZED):
        with run.measuring(f"Q {precision}"):
            res["rows"].append(measure_precision(precision, run.device, run.tiny, bs.PROMPT_TOKENS, repeats))
