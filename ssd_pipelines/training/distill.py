"""Self-distillation of drafting heads from a frozen backbone (docs/decoding.md, "Drafting heads"): the command.

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

A share of the images can be the rollouts of a drafter (`--rollout-heads`):
decoded with `ssd` and those heads, so that the rows above a drafted row are
what they are at inference, drafted and verified rather than AR's.

Generations can be streamed to disk (`--data-dir`): each generated batch is a
safetensors shard, written as soon as it is done, so a long collection that is
stopped resumes where it was, and training reads them back.

The jobs live apart: collection in distill_data.py, the loss in head_loss.py,
the training loop in head_training.py; this module is the command over them.

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
import os
import time
import warnings
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

from ..backbones.base import ImageBackbone
from ..decoding import SSDDecoding
from ..decoding.options import VERIFY_ROUNDS
from ..heads import VERTICAL_DRAFTERS, DraftHeads
from ..sampling_config import SamplingConfig
from .backbone_loading import load_image_backbone
from .distill_data import collect, rollout_images, shard_folder
from .head_loss import LOSSES, check_offsets, check_true_state_share, heldout_acceptance
from .head_training import train_heads


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ssd_pipelines.training.distill",
        description="Distil drafting heads from a frozen backbone: AR generation, then training on it (--loss). "
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
    p.add_argument(
        "--vertical-drafter",
        choices=tuple(VERTICAL_DRAFTERS),
        default="cell",
        help="cell: the paper's per-cell head; row: reads a neighbourhood of the row above; inrow: also the codes "
        "drafted to its left, sampled left to right; recurrent: also the state predicting the cell to its left, "
        "trained unrolled along the row (row kinds: --vertical 1)",
    )
    p.add_argument(
        "--horizontal-from",
        default=None,
        help="a heads folder trained for this backbone: copy its horizontal heads and train only the vertical "
        "drafter (the horizontal heads draft only the first row, yet cost most of a training step)",
    )
    p.add_argument("--row-kernel", type=int, default=5, help="row and inrow: cells of the row above each draft reads")
    p.add_argument("--left-codes", type=int, default=2, help="inrow, recurrent: codes to the left each draft reads")
    p.add_argument(
        "--loss",
        choices=LOSSES,
        default="smooth_l1",
        help="smooth_l1: the paper's, on hidden states; kl: KL(p || q) of the verifier's guided distributions; "
        "kl+smooth_l1: both; tv: total variation, 1 - acceptance",
    )
    p.add_argument(
        "--true-state-share",
        type=float,
        default=0.0,
        help="recurrent: share of cells trained on the true state to their left rather than the drafter's own "
        "output there, as on exact's frontier, where the cell to the left has often been through a pass",
    )
    p.add_argument(
        "--rollout-heads",
        default=None,
        help="a heads folder for this backbone: decode the first --rollout-share of the images with ssd and these "
        "heads instead of AR, reading their states back with one pass over the decoded grid (the rows a drafter "
        "meets at inference: on-policy data)",
    )
    p.add_argument("--rollout-share", type=float, default=0.5, help="share of the images --rollout-heads decodes")
    p.add_argument(
        "--rollout-rounds", type=int, default=VERIFY_ROUNDS.default, help="verify_rounds of ssd for the rollouts"
    )
    p.add_argument(
        "--eval-images",
        type=int,
        default=0,
        help="hold out the last N images each process generated, and log each head's teacher-forced acceptance on "
        "them after training (1 - TV(p, q): what to compare trainings by without decoding)",
    )
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
        vertical_drafter=args.vertical_drafter,
        row_kernel=args.row_kernel,
        left_codes=args.left_codes,
    )


def take_horizontal_heads(heads: DraftHeads, source: DraftHeads, where: str) -> None:
    """Copy `source`'s horizontal heads into `heads` and freeze them: training then fits the vertical drafter only."""
    ours = (heads.config.hidden_size, heads.config.embed_size, heads.config.codebook_size, heads.max_horizontal)
    theirs = (source.config.hidden_size, source.config.embed_size, source.config.codebook_size, source.max_horizontal)
    sizes_of_source_heads = source.config.intermediate_size or 2 * source.config.hidden_size
    if ours != theirs or sizes_of_source_heads != heads.horizontal[0].gate.out_features:
        raise ValueError(
            f"the heads in {where} do not fit: (hidden, embedding, codebook sizes, horizontal heads) = {theirs} "
            f"against {ours} here. Pass heads trained for this backbone, with the same --horizontal and "
            "--intermediate-size."
        )
    heads.horizontal.load_state_dict(source.horizontal.state_dict())
    heads.horizontal.requires_grad_(False)


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
    return load_image_backbone(args.model, accelerator.device, getattr(torch, args.dtype))


def _rollout_decoding(args: argparse.Namespace, backbone: ImageBackbone, images: int) -> SSDDecoding | None:
    """`ssd` with --rollout-heads, or None; refused if the rollouts would reach the held-out images, which
    measure acceptance on the backbone's own AR images."""
    if args.rollout_heads is None:
        return None
    rollouts = rollout_images(images, args.generate_batch_size, args.rollout_share)
    if args.eval_images and rollouts > images - args.eval_images:
        raise ValueError(
            f"{rollouts} of this process's {images} images would be rollouts (whole batches of "
            f"{args.generate_batch_size}), reaching the last {args.eval_images} held out: lower --rollout-share "
            "or --eval-images, or use a smaller --generate-batch-size."
        )
    heads = DraftHeads.from_pretrained(args.rollout_heads).to(backbone.device)
    heads.check_compatible(backbone)
    return SSDDecoding(heads, verify_rounds=args.rollout_rounds)


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
    if args.horizontal_from:
        take_horizontal_heads(heads, DraftHeads.from_pretrained(args.horizontal_from), args.horizontal_from)
    check_offsets(heads, backbone.grid.rows, backbone.grid.cols)  # before generating, not after
    check_true_state_share(heads, args.true_state_share)
    shard = _shard(accelerator, [p for p in _read_prompts(args.prompts) for _ in range(args.images_per_prompt)])
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.guidance)

    rollout = _rollout_decoding(args, backbone, len(shard))
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
        if rollout is not None:  # only then: data dirs written before rollouts existed still match
            settings.update({k: getattr(args, k) for k in ("rollout_heads", "rollout_share", "rollout_rounds")})
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
        rollout=rollout,
        rollout_share=args.rollout_share,
    )
    collect_seconds = time.perf_counter() - started
    accelerator.print(f"process 0 has {len(data)} images after {collect_seconds:.1f}s ({data.nbytes / 2**20:.1f} MiB)")
    heldout = None
    if args.eval_images:
        if not 0 < args.eval_images < len(data):
            raise ValueError(
                f"--eval-images {args.eval_images} must be between 1 and {len(data) - 1}: keep some to train."
            )
        data, heldout = data[: len(data) - args.eval_images], data[len(data) - args.eval_images :]
    # the distribution the verifier draws from, as guided as the data; a temperature of 1 where it was greedy
    verifier = SamplingConfig(args.temperature or 1.0, args.top_k, args.top_p, args.guidance)

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
        args.loss,
        verifier,
        args.true_state_share,
    )
    if heldout is not None:
        log["heldout_acceptance"] = heldout_acceptance(heads, backbone, heldout, verifier)
        accelerator.print(f"teacher-forced acceptance on {len(heldout)} held-out images: {log['heldout_acceptance']}")
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


if __name__ == "__main__":
    main()
