"""What checking loaded weights to be finite costs (issue 40): `check_finite` over models of growing size in a 7B
model's number of tensors, beside copying the same bytes out of a safetensors file in the page cache (what any
loader must do at least), then beside transformers' `from_pretrained` of a bf16 Llama of about 1 GB in each dtype
(the pipeline loads in float32 by default); the cost of a tensor by itself; and what these project for Janus-Pro-7B here and, by memory bandwidth, on an H200.

    python -m ssd_bench.finite_weights                    # CPU (or the GPU if there is one), ~3 min
    python -m ssd_bench.finite_weights --sizes-gb 0.1 0.5 --dtypes bfloat16 --llama-gb 0.2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import JanusForConditionalGeneration, LlamaConfig, LlamaForCausalLM
from transformers.models.janus.configuration_janus import JanusVisionConfig

from ssd_pipelines.finite_weights import check_finite

from .backbone_speed import janus_pro_config

JANUS_PRO_7B_BYTES = 14.8e9  # deepseek-community/Janus-Pro-7B's safetensors, bf16
H200_BYTES_PER_S = 4.8e12  # HBM3e; one aminmax reads each byte once
GPU_LAUNCH_S = 10e-6  # the host's cost of launching a kernel: one a tensor


def model_of(total_bytes: float, tensors: int, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """`tensors` parameters of equal size holding `total_bytes`, written so that their memory is touched."""
    numel = max(1, round(total_bytes / tensors / dtype.itemsize))
    weights = (torch.full((numel,), 0.5, dtype=dtype, device=device) for _ in range(tensors))
    return torch.nn.ParameterList(torch.nn.Parameter(w, requires_grad=False) for w in weights)


def best_seconds(device: torch.device, repeats: int, run: Callable, *args) -> float:
    """The fastest of `repeats` timed runs of `run(*args)`, after one untimed."""
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        run(*args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return min(times[1:])


def copy_out(file: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """Loading at its cheapest: the tensors copied out of the file (`load_file` maps them lazily)."""
    return {key: value.to(device, copy=True) for key, value in load_file(file).items()}


def llama_of(total_bytes: float, folder: Path) -> None:
    """Save in `folder` a bf16 Llama of 2048 wide layers holding about `total_bytes`."""
    config = LlamaConfig(hidden_size=2048, intermediate_size=5504, num_attention_heads=16, vocab_size=32000)
    per_layer, embeddings = 4 * 2048**2 + 3 * 2048 * 5504, 2 * 32000 * 2048
    config.num_hidden_layers = max(1, round((total_bytes / 2 - embeddings) / per_layer))
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


def load_llama(folder: str, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """On the CPU in the file's dtype transformers maps the file lazily: the check is then what first reads it."""
    return LlamaForCausalLM.from_pretrained(folder, dtype=dtype, device_map=str(device))


def janus_pro_7b_tensors() -> tuple[int, int]:
    """Janus-Pro-7B's floating tensors and parameters, counted on the meta device (its SigLIP-L vision tower too,
    which `janus_pro_config` shrinks)."""
    config = janus_pro_config()
    config.vision_config = JanusVisionConfig(projection_dim=config.text_config.hidden_size)
    with torch.device("meta"):
        model = JanusForConditionalGeneration(config)
    floating = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    return len(floating), sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[0.1, 0.5, 1.0, 2.0])
    parser.add_argument("--tensors", type=int, default=290, help="tensors a model (a Llama-7B has 291)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--llama-gb", type=float, default=1.0, help="the Llama loaded with from_pretrained")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"check_finite on {where}, best of {args.repeats}")
    print(f"{'dtype':>9} {'GB':>5} {'tensors':>7} {'check s':>8} {'GB/s':>6} {'copy s':>7} {'check/copy':>10}")
    rows, loads = [], []
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "model.safetensors"
        for name in args.dtypes:
            for gb in args.sizes_gb:
                model = model_of(gb * 1e9, args.tensors, getattr(torch, name), device)
                size = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
                check = best_seconds(device, args.repeats, check_finite, model, folder, "benchmark")
                save_file({str(i): p.data for i, p in enumerate(model)}, file)
                del model
                copy = best_seconds(device, args.repeats, copy_out, file, device)
                rows.append({"dtype": name, "gb": size, "check_s": check, "gb_per_s": size / check, "copy_s": copy})
                print(
                    f"{name:>9} {size:5.2f} {args.tensors:7d} {check:8.3f} {size / check:6.1f} {copy:7.3f} "
                    f"{check / copy:10.0%}"
                )
        llama_of(args.llama_gb * 1e9, Path(folder))
        for name in args.dtypes:
            load = best_seconds(device, args.repeats, load_llama, folder, getattr(torch, name), device)
            llama = load_llama(folder, getattr(torch, name), device)
            check = best_seconds(device, args.repeats, check_finite, llama, folder, "benchmark")
            size = sum(p.numel() * p.element_size() for p in llama.parameters()) / 1e9
            loads.append({"dtype": name, "gb": size, "load_s": load, "check_s": check})
            print(
                f"a bf16 Llama loaded in {name} ({size:.2f} GB in {len(list(llama.parameters()))} tensors): "
                f"from_pretrained {load:.2f} s, check {check:.3f} s ({check / load:.0%})"
            )
    tiny = model_of(1000 * 4, 1000, torch.float32, device)
    per_tensor = best_seconds(device, args.repeats, check_finite, tiny, ".", "benchmark") / 1000
    print(f"per tensor (1000 tensors of one element): {per_tensor * 1e6:.1f} us")
    tensors, parameters = janus_pro_7b_tensors()
    bf16 = [row for row in rows if row["dtype"] == "bfloat16"] or rows
    rate = bf16[-1]["gb_per_s"] * 1e9
    here = JANUS_PRO_7B_BYTES / rate + tensors * per_tensor
    h200 = JANUS_PRO_7B_BYTES / H200_BYTES_PER_S + tensors * GPU_LAUNCH_S
    print(
        f"Janus-Pro-7B: {JANUS_PRO_7B_BYTES / 1e9:.1f} GB in bf16, {tensors} floating tensors "
        f"({parameters / 1e9:.2f}e9 parameters counted on meta)\n"
        f"  here ({rate / 1e9:.1f} GB/s of {bf16[-1]['dtype']}): {here:.1f} s\n"
        f"  H200 by bandwidth: {JANUS_PRO_7B_BYTES / H200_BYTES_PER_S * 1e3:.1f} ms reading "
        f"+ {tensors * GPU_LAUNCH_S * 1e3:.1f} ms launching = {h200 * 1e3:.0f} ms"
    )
    return {
        "device": where,
        "rows": rows,
        "llama": loads,
        "per_tensor_s": per_tensor,
        "janus_pro_7b": {"here_s": here, "h200_s": h200},
    }


if __name__ == "__main__":
    main()
