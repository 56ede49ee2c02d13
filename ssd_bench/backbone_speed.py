"""The GPU check of issue 14: what one AR step and one row-verification pass cost on a Janus-Pro-7B-shaped
backbone, and the per-image speedup those costs project at the paper's step counts.

The backbone is `JanusForConditionalGeneration` with Janus-Pro-7B's language model and image-generation
modules (30 Llama layers of 4096, 16,384 VQ codes, a 24 x 24 grid) and random weights in bf16, run through our
adapter with guidance batched (two rows per image). Its vision tower, unused by generation, is shrunk. Timed,
after warm-up, as medians over repeats:

- prefill: the prompt batch;
- ar_step: one pass of 1 token against a KV cache holding the prompt and half the image (the AR step);
- row_pass: one pass of a whole row (24 tokens) against the same cache, rewound after (a verification round);
- heads: the vertical head drafting that row (SSD's only other work per pass).

The projection charges every SSD pass a full row pass, an upper bound (first-row blocks are shorter):
    AR  = prefill + 576 x ar_step          SSD = prefill + N x (row_pass + heads),  N = 57 (r = 1) or 80

    python -m ssd_bench.backbone_speed --out gpu_check.json        # on a GPU, < 8 minutes
    python -m ssd_bench.backbone_speed --tiny                      # the same code on CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import ChameleonConfig, Emu3Config, JanusConfig, JanusForConditionalGeneration, LlamaConfig

from ssd_pipelines.backbones import JanusProBackbone
from ssd_pipelines.backbones.prompts import left_padded_batch
from ssd_pipelines.heads import DraftHeads
from ssd_pipelines.testing.engine_probes import grid_embeds
from ssd_pipelines.tiny_published import image_token_name

PROMPT_TOKENS = 32  # the Janus-Pro batch's random prompt
PAPER_SSD_PASSES = (57, 80)  # the paper's passes per 24 x 24 image with SSD (r = 1 and its other setting)


def janus_pro_config(tiny: bool = False) -> JanusConfig:
    """Janus-Pro-7B's generation path (deepseek-ai/Janus-Pro-7B's config.json), or a tiny one for CPU."""
    width, layers, codes, patches = (64, 2, 32, 4) if tiny else (4096, 30, 16384, 24)
    text = LlamaConfig(
        hidden_size=width,
        intermediate_size=128 if tiny else 11008,
        num_hidden_layers=layers,
        num_attention_heads=4 if tiny else 32,
        vocab_size=128 if tiny else 102400,
        max_position_embeddings=16384,
        bos_token_id=0,
        pad_token_id=1,
    )
    vq = {"num_embeddings": codes, "projection_dim": width, "image_token_embed_dim": width}  # 8-dim codes
    if tiny:
        vq.update({"base_channels": 32, "channel_multiplier": [1, 1], "num_res_blocks": 1})  # else VQ-16's
    vision = {  # unused by image generation: shrunk
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "mlp_ratio": 2,
        "projection_dim": 64,
        "image_size": 16 * patches,
        "patch_size": 16,
        "num_image_tokens": patches * patches,
    }
    return JanusConfig(text_config=text.to_dict(), vision_config=vision, vq_config=vq, image_token_id=3)


def emu3_gen_config() -> Emu3Config:
    """BAAI/Emu3-Gen-hf's shape (its config.json values) and the vocabulary its adapter reads, for meta models."""
    vocabulary = {f"<|visual token {c:06d}|>": 151854 + c for c in range(32768)}
    vocabulary |= {"<|image start|>": 151851, "<|image token|>": 151852, "<|extra_200|>": 151846, "<image>": 0}
    text = {"vocab_size": 184622, "hidden_size": 4096, "intermediate_size": 14336, "num_key_value_heads": 8}
    return Emu3Config(text_config={**text, "max_position_embeddings": 9216}, vocabulary_map=vocabulary)


def lumina_mgpt_config() -> ChameleonConfig:
    """Alpha-VLLM/Lumina-mGPT-7B-768's shape (Chameleon 7B) and the vocabulary its adapter reads, for meta models."""
    specials = ["<racm3:break>", "<eoss>", "<reserved08706>", "<reserved08799>", "<image>"]
    specials += [f"<reserved{8800 + n:05d}>" for n in range(64)]
    vocabulary = {image_token_name(c): 4 + c for c in range(8192)} | {s: 8196 + i for i, s in enumerate(specials)}
    return ChameleonConfig(vocab_size=65536, hidden_size=4096, intermediate_size=11008, vocabulary_map=vocabulary)


def build(config: JanusConfig, device: torch.device, dtype: torch.dtype) -> tuple[JanusProBackbone, DraftHeads]:
    """The backbone and drafting heads of its shape (5 horizontal, 2 vertical), random, made on `device` in
    `dtype`."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = JanusForConditionalGeneration(config).eval()
            width = config.text_config.hidden_size
            heads = DraftHeads(width, width, config.vq_config.num_embeddings).eval()
    finally:
        torch.set_default_dtype(default)
    model.generation_config.bos_token_id, model.generation_config.pad_token_id = 0, 1
    model.generation_config.generation_kwargs = {"boi_token_id": 2}
    return JanusProBackbone(model), heads


def median_seconds(step: Callable[[], None], device: torch.device, repeats: int, warmup: int = 3) -> float:
    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def measure(
    backbone: JanusProBackbone,
    heads: DraftHeads,
    images: int,
    prompt_tokens: int,
    repeats: int,
    fill: int | None = None,
) -> dict:
    """Seconds of prefill, AR step, row pass and row draft for a batch of `images` with guidance. The cache is filled
    to half the image by passes of `fill` tokens (compiled passes: a row's, whose graph the row pass needs anyway, where
    one pass of half the image would compile a graph of its own), or by one pass."""
    grid, device = backbone.grid, backbone.device
    generator = torch.Generator(device).manual_seed(0)
    rows = 2 * images  # conditional and unconditional
    ids = torch.randint(3, 100, (rows, prompt_tokens), generator=generator, device=device)
    batch = left_padded_batch(ids[:images].tolist(), ids[images:].tolist(), 1, backbone.pad_token_id, grid)
    seconds = {"prefill": median_seconds(lambda: backbone.prefill(batch), device, max(3, repeats // 4))}
    state, _ = backbone.prefill(batch)
    half = grid.num_cells // 2  # the cache holds the prompt and half the image, as mid-way through an image
    codes = torch.randint(0, grid.codebook_size, (images, grid.num_cells), generator=generator, device=device)
    step = fill or half
    for first in range(0, half, step):
        end = min(first + step, half)
        backbone.extend(state, grid_embeds(backbone, codes[:, first:end], first, end, guidance=True))
    start = state.length

    def pass_over(first: int, end: int) -> Callable[[], None]:
        embeds = grid_embeds(backbone, codes[:, first:end], first, end, guidance=True)

        def step() -> None:
            hidden = backbone.extend(state, embeds)
            backbone.code_logits(hidden)  # the target distributions every pass needs
            backbone.rewind(state, start)

        return step

    seconds["ar_step"] = median_seconds(pass_over(half, half + 1), device, repeats)
    seconds["row_pass"] = median_seconds(pass_over(half, half + grid.cols), device, repeats)
    row_hidden = torch.randn(rows, grid.cols, backbone.hidden_size, device=device, dtype=backbone.dtype)
    row_embeds = backbone.embed_codes(codes[:, : grid.cols].repeat(2, 1))  # both guidance branches
    seconds["heads"] = median_seconds(lambda: heads.draft_below(row_hidden, row_embeds, 1), device, repeats)
    return seconds


def paper_passes(grid: list[int]) -> tuple[int, int]:
    """The paper's SSD passes per 24 x 24 image (r=1, r=2); a tiny grid has none, so two that exercise the code."""
    return PAPER_SSD_PASSES if grid == [24, 24] else (grid[0] + 2, 2 * grid[0])


def project(seconds: dict, ar_passes: int, ssd_passes: tuple[int, ...]) -> dict:
    """Seconds of a batch's images with AR and with SSD at the given pass counts, and their ratio."""
    ar = seconds["prefill"] + ar_passes * seconds["ar_step"]
    projected = {"ar_seconds": ar}
    for n in ssd_passes:
        ssd = seconds["prefill"] + n * (seconds["row_pass"] + seconds["heads"])
        projected[f"ssd_{n}_seconds"] = ssd
        projected[f"ssd_{n}_speedup"] = ar / ssd
    return projected


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model in float32 on CPU (checks the code only)")
    parser.add_argument("--images", type=int, nargs="+", default=[1, 16], help="batch sizes (images, 2 rows each)")
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    started = time.perf_counter()
    backbone, heads = build(janus_pro_config(args.tiny), device, dtype)
    grid = backbone.grid
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "torch": torch.__version__,
        "grid": [grid.rows, grid.cols],
        "backbone_parameters": sum(p.numel() for p in backbone.model.parameters()),
        "build_seconds": round(time.perf_counter() - started, 1),
        "batches": {},
    }
    ar_passes = grid.num_cells
    ssd_passes = paper_passes([grid.rows, grid.cols])
    for images in args.images:
        seconds = measure(backbone, heads, images, args.prompt_tokens, args.repeats)
        projected = project(seconds, ar_passes, ssd_passes)
        result["batches"][images] = {"seconds": seconds, "projected": projected}
        speedups = ", ".join(f"{n} passes {projected[f'ssd_{n}_speedup']:.2f}x" for n in ssd_passes)
        print(
            f"{images:3d} image(s): AR step {seconds['ar_step'] * 1e3:7.2f} ms, row pass "
            f"{seconds['row_pass'] * 1e3:7.2f} ms, heads {seconds['heads'] * 1e3:6.2f} ms; "
            f"AR {ar_passes} passes -> SSD {speedups}"
        )
    if device.type == "cuda":
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
    result["total_seconds"] = round(time.perf_counter() - started, 1)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
