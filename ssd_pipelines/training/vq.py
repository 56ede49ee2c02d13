"""Train the reference VQ tokenizer: 64x64 RGB scenes <-> 16x16 grids of codebook indices.

A small ``diffusers.VQModel`` (three blocks, two 2x downsamplings) trained on
procedural scenes drawn on the fly, with reconstruction loss (L1 + MSE) plus the
quantizer's own codebook/commitment loss. Unused codebook entries are restarted
from encoder outputs every few steps, which keeps codebook usage high; without
it most of the codebook never moves from its tiny initialisation.

``ssd_pipelines.vq`` holds ``encode_images`` / ``decode_codes``, the entry
points the rest of the project uses to turn images into tokens and back.

CLI::

    python -m ssd_pipelines.training.vq --out hub_cards/ssd-reference/vq --steps 2000 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import VQModel
from tqdm.auto import tqdm

from ..reference.scenes import HELDOUT_SEED_START, IMAGE_SIZE, make_dataset, sample_scene
from ..vq import decode_codes, encode_images, images_to_tensor


@dataclass
class VQConfig:
    """Architecture and optimisation settings; defaults are the shipped reference tokenizer."""

    block_out_channels: tuple[int, ...] = (16, 32, 64)
    latent_channels: int = 8
    num_vq_embeddings: int = 512
    norm_num_groups: int = 8
    steps: int = 2000
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 50
    restart_every: int = 50
    # Stop restarting codes after this fraction of training, so the last steps fine-tune a fixed codebook.
    restart_until: float = 0.8
    seed: int = 0
    eval_images: int = 256
    print_every: int = 25  # steps between updates of the progress bar's loss, PSNR and codebook use


def build_vq(config: VQConfig) -> VQModel:
    """A fresh VQModel whose latent grid is IMAGE_SIZE / 4 on a side."""
    n = len(config.block_out_channels)
    return VQModel(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=tuple(config.block_out_channels),
        layers_per_block=1,
        latent_channels=config.latent_channels,
        vq_embed_dim=config.latent_channels,
        num_vq_embeddings=config.num_vq_embeddings,
        norm_num_groups=config.norm_num_groups,
        sample_size=IMAGE_SIZE,
    )


def _quantize(vq: VQModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encoder latents ``z``, their quantization ``z_q``, the quantizer loss and the flat code indices."""
    z = vq.encode(x).latents
    z_q, vq_loss, (_, _, indices) = vq.quantize(z)
    return z, z_q, vq_loss, indices.reshape(-1)


@torch.no_grad()
def _restart_dead_codes(
    vq: VQModel, counts: torch.Tensor, z: torch.Tensor, optimizer: torch.optim.Optimizer, gen: torch.Generator
) -> int:
    """Move never-chosen codebook entries onto random encoder outputs; returns how many moved."""
    dead = (counts == 0).nonzero().squeeze(1)
    if len(dead) == 0:
        return 0
    flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
    pick = torch.randint(len(flat), (len(dead),), generator=gen)
    jitter = 0.01 * flat.std() * torch.randn(len(dead), flat.shape[1], generator=gen)
    weight = vq.quantize.embedding.weight
    weight[dead] = flat[pick] + jitter
    state = optimizer.state.get(weight)
    if state:  # stale Adam moments would drag the restarted entries straight back
        state["exp_avg"][dead] = 0
        state["exp_avg_sq"][dead] = 0
    return len(dead)


def _lr_factor(step: int, config: VQConfig) -> float:
    """Linear warm-up, then cosine decay to 10%."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    t = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))


def _psnr(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB for images in [0, 1]."""
    mse = ((pred - target) ** 2).flatten(1).mean(1).clamp_min(1e-10)
    return -10.0 * torch.log10(mse)


@torch.no_grad()
def evaluate_vq(vq: VQModel, n_images: int = 256, batch_size: int = 64) -> dict[str, float]:
    """Held-out reconstruction PSNR (mean over images, dB) and the fraction of the codebook used."""
    scenes = make_dataset(n_images, HELDOUT_SEED_START)
    images = np.stack([s.image for s in scenes])
    psnrs, used = [], torch.zeros(vq.config.num_vq_embeddings, dtype=torch.bool)
    for i in range(0, n_images, batch_size):
        batch = images[i : i + batch_size]
        codes = encode_images(vq, batch)
        used[codes.flatten().cpu()] = True
        recon = decode_codes(vq, codes).cpu()
        target = torch.as_tensor(batch).permute(0, 3, 1, 2).float() / 255.0
        psnrs.append(_psnr(recon, target))
    return {"psnr": float(torch.cat(psnrs).mean()), "codebook_usage": float(used.float().mean())}


def _batch(step: int, config: VQConfig) -> torch.Tensor:
    first = config.seed + step * config.batch_size
    if first + config.batch_size > HELDOUT_SEED_START:
        raise ValueError("training seeds ran into the held-out split")
    return images_to_tensor(np.stack([sample_scene(s).image for s in range(first, first + config.batch_size)]))


def train_vq(config: VQConfig) -> tuple[VQModel, dict]:
    """Train a VQModel on procedural training scenes; returns the model and a JSON-ready log."""
    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    vq = build_vq(config).train()
    # Standard VQ-VAE weighting (beta on the commitment term); diffusers defaults to the legacy swap.
    vq.quantize.legacy = False
    optimizer = torch.optim.Adam(vq.parameters(), lr=config.lr)
    counts = torch.zeros(config.num_vq_embeddings, dtype=torch.long)
    log: dict = {"config": asdict(config), "loss": [], "recon_loss": [], "vq_loss": [], "restarts": []}
    start = time.time()
    bar = tqdm(range(config.steps), desc="training VQ", unit="step")
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = config.lr * _lr_factor(step, config)
        x = _batch(step, config)
        z, z_q, vq_loss, indices = _quantize(vq, x)
        # Codebook initialisation (step 0) and periodic dead-code restarts, from this batch's latents.
        if step % config.restart_every == 0 and step < config.restart_until * config.steps:
            moved = _restart_dead_codes(vq, counts, z.detach(), optimizer, gen)
            log["restarts"].append([step, moved])
            counts.zero_()
            if moved:
                z, z_q, vq_loss, indices = _quantize(vq, x)
        counts += torch.bincount(indices, minlength=config.num_vq_embeddings)
        recon = vq.decode(z_q, force_not_quantize=True).sample
        recon_loss = F.l1_loss(recon, x) + F.mse_loss(recon, x)
        loss = recon_loss + vq_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        for key, value in (("loss", loss), ("recon_loss", recon_loss), ("vq_loss", vq_loss)):
            log[key].append(round(value.item(), 5))
        if step % config.print_every == 0 or step == config.steps - 1:
            psnr = float(_psnr((recon.detach() + 1) / 2, (x + 1) / 2).mean())
            bar.set_postfix(
                loss=f"{loss.item():.4f}",
                recon=f"{recon_loss.item():.4f}",
                psnr=f"{psnr:.2f}",
                lr=f"{optimizer.param_groups[0]['lr']:.1e}",
                codes_used=int((counts > 0).sum()),
            )
    vq.eval()
    log["train_seconds"] = round(time.time() - start, 1)
    log["params"] = sum(p.numel() for p in vq.parameters())
    log["heldout"] = evaluate_vq(vq, config.eval_images)
    return vq, log


def save_vq(vq: VQModel, out: str | Path, dtype: torch.dtype = torch.float16) -> None:
    """``save_pretrained`` as safetensors in ``dtype``, leaving ``vq`` itself untouched."""
    copy.deepcopy(vq).to(dtype).save_pretrained(str(out), safe_serialization=True)


def load_vq(path: str | Path) -> VQModel:
    """Load a saved tokenizer in float32 eval mode (fp16 convolutions are slow or missing on CPU)."""
    return VQModel.from_pretrained(str(path), dtype=torch.float32).eval()


def main(argv: list[str] | None = None) -> None:
    defaults = VQConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for VQModel.save_pretrained")
    p.add_argument("--steps", type=int, default=defaults.steps)
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--channels", default=",".join(map(str, defaults.block_out_channels)), help="block_out_channels")
    p.add_argument("--latent-channels", type=int, default=defaults.latent_channels)
    p.add_argument("--codebook-size", type=int, default=defaults.num_vq_embeddings)
    p.add_argument("--norm-groups", type=int, default=defaults.norm_num_groups)
    p.add_argument("--restart-every", type=int, default=defaults.restart_every)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--eval-images", type=int, default=defaults.eval_images)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads; default: torch's choice")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="dtype of saved weights")
    p.add_argument("--log", default=None, help="JSON log path (default: OUT/train_log.json)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = VQConfig(
        block_out_channels=tuple(int(c) for c in args.channels.split(",")),
        latent_channels=args.latent_channels,
        num_vq_embeddings=args.codebook_size,
        norm_num_groups=args.norm_groups,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        restart_every=args.restart_every,
        seed=args.seed,
        eval_images=args.eval_images,
    )
    vq, log = train_vq(config)
    save_vq(vq, args.out, getattr(torch, args.dtype))
    # Metrics of what was actually shipped (weights rounded to the saved dtype).
    log["heldout_saved"] = evaluate_vq(load_vq(args.out), config.eval_images)
    log["saved_bytes"] = sum(f.stat().st_size for f in Path(args.out).iterdir() if f.is_file())
    log_path = Path(args.log) if args.log else Path(args.out) / "train_log.json"
    log_path.write_text(json.dumps(log))
    print(json.dumps({k: log[k] for k in ("train_seconds", "params", "heldout", "heldout_saved", "saved_bytes")}))


if __name__ == "__main__":
    main()
