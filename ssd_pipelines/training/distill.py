"""Self-distillation of drafting heads from a frozen backbone (docs/decoding.md, "Drafting heads").

The backbone writes images with plain AR decoding; for every cell we keep the
pre-norm hidden state h(y, x) that predicted it, in both guidance branches, and
the code it chose. Each head of offset (dy, dx) then learns
f([h(y, x); e(y, x)]) ~ h(y + dy, x + dx) under Smooth L1, with e the backbone's
input embedding of the chosen code. No cross-entropy: the draft distribution
comes from the backbone's own norm and output head applied to the predicted h.
Both branches are training data because the heads draft both at inference.

Distributed runs (``accelerate launch``): every process generates its own shard
of the images with its own seed and trains on that shard, with DDP averaging
the heads' gradients at every step. We sync gradients rather than gather the
data because the data (hidden states of every cell, up to gigabytes) dwarfs
the heads' gradients (a few MB per step), and shards drawn from the same prompt
distribution make the averaged gradient that of one batch of
`batch_size x num_processes` images drawn from the union.

Generations can be streamed to disk (`--data-dir`): each generated batch is a
safetensors shard, written as soon as it is done, so a long collection that is
stopped resumes where it was, and training reads them back.

CLI::

    accelerate launch -m ssd_pipelines.training.distill --model DIR --prompts prompts.txt --out heads/
    accelerate launch --multi_gpu --num_processes 8 -m ssd_pipelines.training.distill \
        --model deepseek-community/Janus-Pro-7B --dtype bfloat16 --guidance 5 ... (docs/backbones.md)
    python -m ssd_pipelines.training.distill --tiny-random --prompts prompts.txt --out /tmp/heads --steps 50

Several CPU processes: ``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m ...``.
``accelerate launch --cpu --num_processes 2`` starts a single process unless
accelerate is configured to call mpirun (huggingface/accelerate#2741); the CLI
warns when it sees that case.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import gather_object
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from ..backbones.base import ImageBackbone
from ..decoding import ARDecoding
from ..decoding.base import DecodeOutput
from ..heads import DraftHeads
from ..sampling import SamplingConfig


@dataclass
class DistillationData:
    """What the frozen backbone wrote, per image: h at every cell in each guidance branch, and the codes.

    hidden: [N, S, R, C, d], S = 2 with guidance (conditional, unconditional), else 1;
        16-bit on CPU, because it is nearly all of the memory.
    codes: [N, R, C] int32, shared by the branches.
    """

    hidden: torch.Tensor
    codes: torch.Tensor

    def __len__(self) -> int:
        return self.codes.shape[0]

    def __getitem__(self, index: torch.Tensor | slice) -> DistillationData:
        return DistillationData(self.hidden[index], self.codes[index])

    @property
    def nbytes(self) -> int:
        return self.hidden.nbytes + self.codes.nbytes

    @classmethod
    def concat(cls, parts: list[DistillationData]) -> DistillationData:
        return cls(torch.cat([p.hidden for p in parts]), torch.cat([p.codes for p in parts]))

    @classmethod
    def from_decode(cls, output: DecodeOutput, storage_dtype: torch.dtype | None = None) -> DistillationData:
        """Regroup an AR output's [B', R, C, d] states (conditional rows first) per image, stored compactly."""
        images = output.codes.shape[0]
        branches = output.hidden.shape[0] // images
        hidden = output.hidden.unflatten(0, (branches, images)).transpose(0, 1)
        stored = hidden.to("cpu", storage_dtype or _storage_dtype(hidden.dtype)).contiguous()
        if not torch.isfinite(stored).all():
            raise ValueError(
                f"the backbone's hidden states overflow {stored.dtype}: collect with "
                "storage_dtype=torch.bfloat16 (same range as float32) or torch.float32."
            )
        return cls(stored, output.codes.to("cpu", torch.int32))


def _storage_dtype(hidden_dtype: torch.dtype) -> torch.dtype:
    """16 bits a value: a bf16 backbone keeps bf16 (its range); fp32 and fp16 become fp16 (finer than bf16)."""
    return torch.bfloat16 if hidden_dtype == torch.bfloat16 else torch.float16


def collect(
    backbone: ImageBackbone,
    prompts: list[str],
    sampling: SamplingConfig,
    images_per_prompt: int = 1,
    batch_size: int = 64,
    seed: int = 0,
    storage_dtype: torch.dtype | None = None,
    shards: Path | None = None,
    progress: bool = False,
) -> DistillationData:
    """Generate images_per_prompt images per prompt with AR, batch_size images per batch, recording h and codes.

    Decoding is memory-bound, so a batch of 64 images costs little more than one. With `shards`, every batch is
    also written there as it is done, and a batch already written is read back instead of generated again (the
    batch's own seed makes it the same either way).
    """
    images = [prompt for prompt in prompts for _ in range(images_per_prompt)]
    if not images:
        raise ValueError("collect needs at least one prompt and images_per_prompt >= 1.")
    strategy = ARDecoding(record_hidden=True)
    parts = []
    starts = range(0, len(images), batch_size)
    for index, start in enumerate(tqdm(starts, desc="generating", unit="batch", disable=not progress)):
        shard = None if shards is None else shards / f"batch-{index:05d}.safetensors"
        if shard is not None and shard.is_file():
            parts.append(DistillationData(**load_file(shard)))
            continue
        batch = backbone.encode_prompts(images[start : start + batch_size], guidance=sampling.uses_guidance)
        generator = torch.Generator(backbone.device).manual_seed(seed + 1_000_003 * index)  # its own stream
        output = strategy.decode(backbone, batch, sampling, generator=generator)
        parts.append(DistillationData.from_decode(output, storage_dtype))
        if shard is not None:
            save_file({"hidden": parts[-1].hidden, "codes": parts[-1].codes}, shard)
    return DistillationData.concat(parts)


def shard_folder(data_dir: Path, settings: dict, process_index: int) -> Path:
    """This process's shard folder under `data_dir`, which must hold shards of these very settings (or none)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    recorded = data_dir / "collection.json"
    if recorded.is_file() and json.loads(recorded.read_text()) != settings:
        raise ValueError(
            f"{data_dir} holds generations made with other settings ({recorded}): use another --data-dir, "
            "or the same model, prompts, sampling, batch size and seed."
        )
    recorded.write_text(json.dumps(settings, indent=1))
    folder = data_dir / f"process-{process_index}"
    folder.mkdir(exist_ok=True)
    return folder


def head_offsets(heads: DraftHeads) -> list[tuple[str, tuple[int, int], nn.Module]]:
    """(name, (dy, dx), head) for every head: horizontal ones first, as in the loss vector."""
    right = [(f"horizontal_{dx}", (0, dx), head) for dx, head in enumerate(heads.horizontal, start=1)]
    below = [(f"vertical_{dy}", (dy, 0), head) for dy, head in enumerate(heads.vertical, start=1)]
    return right + below


def check_offsets(heads: DraftHeads, rows: int, cols: int) -> None:
    """Raise if a head's offset leaves the grid: it would have no cell to learn from."""
    for name, (dy, dx), _ in head_offsets(heads):
        if dy >= rows or dx >= cols:
            raise ValueError(f"head {name} has no target cell in a {rows}x{cols} grid: train fewer heads.")


class HeadLosses(nn.Module):
    """Smooth L1 of every head on a batch, as one module so DDP can wrap it (DraftHeads has no forward)."""

    def __init__(self, heads: DraftHeads):
        super().__init__()
        self.heads = heads

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """hidden [b, S, R, C, d], embeds [b, R, C, d_e] -> loss of each head [n_heads], over every cell with a target."""
        rows, cols = hidden.shape[2:4]
        check_offsets(self.heads, rows, cols)
        embeds = embeds.unsqueeze(1).expand(-1, hidden.shape[1], -1, -1, -1)
        losses = []
        for _, (dy, dx), head in head_offsets(self.heads):
            source = (slice(None), slice(None), slice(0, rows - dy), slice(0, cols - dx))
            target = (slice(None), slice(None), slice(dy, None), slice(dx, None))
            losses.append(F.smooth_l1_loss(head(hidden[source], embeds[source]), hidden[target]))
        return torch.stack(losses)


def distill_loss(
    heads: DraftHeads, backbone: ImageBackbone, batch: DistillationData
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the heads' losses, each head's loss [n_heads] detached); order as in `head_offsets`.

    Summed, not averaged: every head then gets exactly the gradient of its own loss.
    """
    return _batch_loss(HeadLosses(heads), backbone, batch)


def _batch_loss(
    objective: nn.Module, backbone: ImageBackbone, batch: DistillationData
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss through `objective`: HeadLosses itself, or the DDP wrapper train_heads prepared around it."""
    weight = next(objective.parameters())
    with torch.no_grad():  # the backbone is only read: no gradient can reach it
        embeds = backbone.embed_codes(batch.codes.to(backbone.device, torch.long))
    hidden = batch.hidden.to(weight.device, weight.dtype)
    per_head = objective(hidden, embeds.to(weight.device, weight.dtype))
    return per_head.sum(), per_head.detach()


def _batches(size: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Image indices, batch_size at a time, reshuffled every epoch; a batch never spans two epochs."""
    batch_size = min(batch_size, size)
    while True:
        order = torch.randperm(size, generator=generator)
        for start in range(0, size - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


def _schedule(optimizer: torch.optim.Optimizer, schedule: str, steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    if schedule == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps)))
    if schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}.")


def train_heads(
    heads: DraftHeads,
    backbone: ImageBackbone,
    data: DistillationData,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 16,
    accelerator: Accelerator | None = None,
    log_every: int = 10,
    schedule: str = "cosine",
    seed: int = 0,
) -> dict:
    """Train `heads` in place with AdamW on this process's `data`; returns a JSON-ready log.

    Under several processes DDP averages gradients every step, so every process
    must run the same number of steps. The backbone is only read (under no_grad)
    and never reaches the optimizer. The loss curve holds [step, loss] averaged
    over the steps since the previous entry and over processes; the first entry
    is step 0 alone, the untrained loss. `final_per_head` splits the last entry by head.
    """
    if steps < 1 or len(data) == 0:
        raise ValueError(f"training needs steps >= 1 and some data, got steps={steps} and {len(data)} images.")
    accelerator = accelerator or Accelerator()
    heads.train()
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr)
    # Not prepared: accelerate would step a prepared scheduler once per process, and every process runs all steps.
    scheduler = _schedule(optimizer, schedule, steps)
    objective, optimizer = accelerator.prepare(HeadLosses(heads), optimizer)
    batches = _batches(len(data), batch_size, torch.Generator().manual_seed(seed + accelerator.process_index))
    names = [name for name, _, _ in head_offsets(heads)]
    log: dict = {"loss": [], "final_per_head": {}, "steps": 0}
    window: list[torch.Tensor] = []
    bar = tqdm(range(steps), desc="training heads", unit="step", disable=not accelerator.is_main_process)
    for step in bar:
        loss, per_head = _batch_loss(objective, backbone, data[next(batches)])
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        window.append(per_head)
        log["steps"] = step + 1
        if step % log_every == 0 or step == steps - 1:
            mean = accelerator.reduce(torch.stack(window).mean(0), reduction="mean").tolist()
            log["loss"].append([step, round(sum(mean), 6)])
            log["final_per_head"] = {name: round(value, 6) for name, value in zip(names, mean)}
            bar.set_postfix(loss=f"{sum(mean):.4f}", lr=f"{scheduler.get_last_lr()[0]:.1e}")
            window = []
    heads.eval()
    return log


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ssd_pipelines.training.distill",
        description="Distil drafting heads from a frozen backbone: AR generation, then Smooth L1 training. "
        "Runs on one process, or split across processes under `accelerate launch` (several CPU processes: "
        "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N -m ssd_pipelines.training.distill ...).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model",
        help="a pipeline or a published backbone's checkpoint (folder or Hub id, e.g. deepseek-community/Janus-Pro-7B), "
        "or a folder with backbone/ (LlamaForCausalLM with config.image_grid) and tokenizer/",
    )
    source.add_argument(
        "--tiny-random", action="store_true", help="TEST ONLY: a tiny random 6x6-grid backbone, for smoke tests"
    )
    p.add_argument("--prompts", required=True, help="text file, one prompt per line")
    p.add_argument("--out", required=True, help="folder for the heads (save_pretrained) and distill_log.json")
    p.add_argument("--images-per-prompt", type=int, default=1)
    p.add_argument("--generate-batch-size", type=int, default=64, help="images decoded together")
    p.add_argument("--guidance", type=float, default=1.0, help="guidance scale of the data (1 = none)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--horizontal", type=int, default=5, help="number of horizontal heads, offsets (0, 1..k)")
    p.add_argument("--vertical", type=int, default=2, help="number of vertical heads, offsets (1..k, 0)")
    p.add_argument("--intermediate-size", type=int, default=None, help="SwiGLU width (default: 2 x hidden size)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=16, help="images per training step, per process")
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="process i generates with seed + i")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="backbone dtype")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads per process (default: torch's)")
    p.add_argument("--base-model", default=None, help="config.base_model of the heads (default: --model)")
    p.add_argument(
        "--data-dir", default=None, help="write each generated batch here as it is done; a rerun resumes from it"
    )
    return p


def _read_prompts(path: str) -> list[str]:
    prompts = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompts: write one per line.")
    return prompts


def _new_heads(backbone: ImageBackbone, args: argparse.Namespace) -> DraftHeads:
    torch.manual_seed(args.seed)  # the same initial heads on every process
    return DraftHeads(
        hidden_size=backbone.hidden_size,
        embed_size=backbone.embed_size,
        codebook_size=backbone.grid.codebook_size,
        horizontal_offsets=tuple(range(1, args.horizontal + 1)),
        vertical_offsets=tuple(range(1, args.vertical + 1)),
        intermediate_size=args.intermediate_size,
        base_model=args.base_model or (args.model or "ssd-pipelines/tiny-random"),
    )


def _shard(accelerator: Accelerator, images: list[str]) -> list[str]:
    """This process's share of the images (one entry per image, so 1 prompt x 8 images splits too)."""
    if len(images) < accelerator.num_processes:
        raise ValueError(
            f"{len(images)} images cannot feed {accelerator.num_processes} processes: add prompts or images."
        )
    with accelerator.split_between_processes(images) as shard:
        return list(shard)


def _warn_if_one_process_was_launched(accelerator: Accelerator) -> None:
    """`accelerate launch --cpu --num_processes N` sets MASTER_PORT but starts one process (no mpirun): say so."""
    if accelerator.num_processes == 1 and "MASTER_PORT" in os.environ and "WORLD_SIZE" not in os.environ:
        warnings.warn(
            "accelerate launched a single process although several were probably asked for: with --cpu it needs "
            "mpirun. For several CPU processes use `ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N`.",
            stacklevel=2,
        )


def _build_backbone(args: argparse.Namespace, accelerator: Accelerator) -> ImageBackbone:
    if args.tiny_random:
        from ..testing import tiny_backbone

        backbone = tiny_backbone(rows=6, cols=6, codebook_size=8)
        backbone.model.requires_grad_(False)
        return backbone
    return load_backbone(args.model, accelerator.device, getattr(torch, args.dtype))


def _save(out: Path, heads: DraftHeads, log: dict) -> None:
    heads.save_pretrained(out)
    (out / "distill_log.json").write_text(json.dumps(log, indent=1))


def main(argv: list[str] | None = None) -> None:
    """Generate this process's shard, train on it with the others, and save the heads and the log from process 0."""
    args = _parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    accelerator = Accelerator()
    _warn_if_one_process_was_launched(accelerator)
    backbone = _build_backbone(args, accelerator)
    heads = _new_heads(backbone, args)
    check_offsets(heads, backbone.grid.rows, backbone.grid.cols)  # before generating, not after
    shard = _shard(accelerator, [p for p in _read_prompts(args.prompts) for _ in range(args.images_per_prompt)])
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.guidance)

    started = time.perf_counter()
    seed = args.seed + accelerator.process_index
    shards = None
    if args.data_dir:
        settings = {
            k: getattr(args, k)
            for k in (
                "model",
                "prompts",
                "images_per_prompt",
                "generate_batch_size",
                "guidance",
                "temperature",
                "top_k",
                "top_p",
                "seed",
                "dtype",
            )
        }
        shards = shard_folder(Path(args.data_dir), settings, accelerator.process_index)
    data = collect(
        backbone,
        shard,
        sampling,
        1,
        args.generate_batch_size,
        seed,
        shards=shards,
        progress=accelerator.is_main_process,
    )
    collect_seconds = time.perf_counter() - started
    accelerator.print(f"process 0 has {len(data)} images after {collect_seconds:.1f}s ({data.nbytes / 2**20:.1f} MiB)")

    started = time.perf_counter()
    log = train_heads(
        heads,
        backbone,
        data,
        args.steps,
        args.lr,
        args.batch_size,
        accelerator,
        args.log_every,
        args.schedule,
        args.seed,
    )
    process = {
        "process_index": accelerator.process_index,
        "images": len(data),
        "data_bytes": data.nbytes,
        "collect_seconds": round(collect_seconds, 2),
        "steps": log.pop("steps"),
        "train_seconds": round(time.perf_counter() - started, 2),
    }
    processes = gather_object([process])
    if accelerator.is_main_process:
        _save(Path(args.out), heads, {"config": vars(args), "processes": processes, **log})
    accelerator.wait_for_everyone()
    accelerator.end_training()


def load_backbone(model: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> ImageBackbone:
    """A frozen backbone from whatever `SSDAutoregressivePipeline.from_pretrained` loads (a pipeline, or a
    published backbone's transformers checkpoint such as deepseek-community/Janus-Pro-7B), or from a folder
    holding backbone/ (LlamaForCausalLM) and tokenizer/, as the reference trainer writes it."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from ..backbones import LlamaGridBackbone
    from ..pipeline_ssd import SSDAutoregressivePipeline

    folder = Path(model)
    if (folder / "backbone").is_dir() and not (folder / "model_index.json").is_file():
        llama = LlamaForCausalLM.from_pretrained(folder / "backbone", dtype=dtype).to(device).eval()
        llama.requires_grad_(False)
        return LlamaGridBackbone(llama, AutoTokenizer.from_pretrained(folder / "tokenizer"))
    pipe = SSDAutoregressivePipeline.from_pretrained(model, dtype=dtype).to(device)
    pipe.backbone.requires_grad_(False)
    return pipe.image_backbone


if __name__ == "__main__":
    main()
