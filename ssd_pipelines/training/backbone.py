"""Train the reference backbone: a small `LlamaForCausalLM` that writes 16 x 16 VQ codes after a caption.

Sequence: [BOS, caption words, BOI, 16 x (16 codes, EOL), EOI], next-token loss on
the image part only. About 10% of captions are dropped for guidance: their words
become pad tokens (still attended), exactly the unconditional prompt the Llama
adapter builds at inference. Batches hold captions of one length, so training
needs no padding mask. On a GPU it trains under bf16 autocast; the encoded
scenes can be cached (`--scene-cache`), so that a GPU run spends its time training.

    python -m ssd_pipelines.training.backbone --vq hub_cards/ssd-reference/vqvae \
        --out runs/backbone --images 26000 --steps 800 --scene-cache runs/scenes_26000.safetensors
    # a run that a later one resumes (runs/next continues from runs/backbone/state, no new warm-up):
    python -m ssd_pipelines.training.backbone ... --schedule wsd --out runs/backbone
    python -m ssd_pipelines.training.backbone ... --schedule wsd --resume runs/backbone/state --out runs/next
    # on a GPU machine: fresh scenes rendered by its CPU cores, bf16, big batches (v5, docs/reference_training.md)
    python -m ssd_pipelines.training.backbone ... --device cuda --images 800000 --render-workers 15 --batch-size 256
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import VQModel
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ..backbones import GridTokens
from ..reference.caption_tokenizer import build_caption_tokenizer
from ..reference.scenes import weighted_seeds
from .encoded_scenes import EncodedScenes, cached_scenes
from .training_state import load_optimizer_state, save_training_state


@dataclass
class BackboneConfig:
    hidden_size: int = 256
    layers: int = 6
    attention_heads: int = 4
    intermediate_size: int = 688
    images: int = 26_000  # training scenes, seeds 0..images-1 (the training split) unless task_weights is set
    task_weights: str = ""  # e.g. "color_attr=3,position=3": scenes per task in these proportions (others 1)
    steps: int = 800
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    prompt_dropout: float = 0.1
    seed: int = 0
    log_every: int = 25
    max_minutes: float = 0.0  # > 0: stop at this wall-clock budget, the LR schedule shortened to match
    schedule: str = "cosine"  # or "wsd": warm-up, constant, then a linear decay over the last decay_fraction
    decay_fraction: float = 0.2
    init: str = ""  # a saved backbone folder to continue training from (a new warm-up and cosine cycle)
    resume: str = ""  # an earlier "wsd" run's state/ folder: its weights and Adam moments where its decay began
    scene_cache: str = ""  # safetensors file of the encoded scenes: read when present, else written
    device: str = ""  # torch device; default: cuda when available (bf16 autocast there), else cpu
    render_workers: int = 1  # processes that render the scenes to encode (a GPU machine's CPU cores)


def training_seeds(config: BackboneConfig) -> Sequence[int]:
    """The scenes a run trains on: the first `images` of the training split, or as many in the task proportions
    of `task_weights`."""
    if not config.task_weights:
        return range(config.images)
    weights = {}
    for item in config.task_weights.split(","):
        task, _, weight = item.partition("=")
        try:
            weights[task.strip()] = float(weight)
        except ValueError:
            raise ValueError(f"task weight {item!r} is not task=number, e.g. color_attr=3") from None
    return weighted_seeds(config.images, weights)


def reference_grid_tokens(tokenizer: PreTrainedTokenizerBase, codebook_size: int) -> GridTokens:
    """The vocabulary layout: caption words, then BOI, EOI, EOL, then the image codes."""
    text = len(tokenizer)
    return GridTokens(
        rows=16,
        cols=16,
        codebook_size=codebook_size,
        code_offset=text + 3,
        boi_token_id=text,
        eoi_token_id=text + 1,
        eol_token_id=text + 2,
        pixels_per_code=4,
    )


def build_backbone(config: BackboneConfig, tokens: GridTokens, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A fresh model of the configured size, or the saved one that `config.init` or `config.resume` names."""
    if config.init and config.resume:
        raise ValueError("pass --init (weights, new warm-up) or --resume (a saved state), not both")
    if config.init or config.resume:
        return load_llama_model(Path(config.init) if config.init else Path(config.resume) / "backbone", tokens)
    llama = LlamaConfig(
        vocab_size=tokens.code_offset + tokens.codebook_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers,
        num_attention_heads=config.attention_heads,
        num_key_value_heads=config.attention_heads,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokens.eoi_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        image_grid=tokens.to_dict(),
    )
    torch.manual_seed(config.seed)
    return LlamaForCausalLM(llama)


def load_llama_model(folder: Path, tokens: GridTokens) -> LlamaForCausalLM:
    """Load a saved backbone whose vocabulary layout must be `tokens` (same codebook and caption words)."""
    model = LlamaForCausalLM.from_pretrained(folder, use_safetensors=True, dtype=torch.float32)
    saved = getattr(model.config, "image_grid", None)
    if saved != tokens.to_dict():
        raise ValueError(
            f"{folder}: its image_grid {saved} does not match the expected {tokens.to_dict()}; "
            "use a backbone trained with the same VQ codebook and caption tokenizer"
        )
    return model


def image_sequence(codes: torch.Tensor, tokens: GridTokens) -> torch.Tensor:
    """Codes [B, 16, 16] -> vocabulary ids of the image part [B, 16 * 17 + 1]: rows with EOL, then EOI."""
    rows = codes + tokens.code_offset
    eol = torch.full((*codes.shape[:2], 1), tokens.eol_token_id, dtype=codes.dtype)
    eoi = torch.full((codes.shape[0], 1), tokens.eoi_token_id, dtype=codes.dtype)
    return torch.cat([torch.cat([rows, eol], dim=2).flatten(1), eoi], dim=1)


def indices_by_length(captions: list[list[int]]) -> list[np.ndarray]:
    """The caption indices grouped by caption length: each group batches without padding."""
    by_length: dict[int, list[int]] = {}
    for index, caption in enumerate(captions):
        by_length.setdefault(len(caption), []).append(index)
    return [np.array(v) for v in by_length.values()]


class LengthBuckets:
    """Batches of captions of equal length, drawn at random: no padding in training."""

    def __init__(self, captions: list[list[int]], batch_size: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.batch_size = batch_size
        self.buckets = indices_by_length(captions)
        self.weights = np.array([len(b) for b in self.buckets], dtype=float) / len(captions)

    def sample(self) -> np.ndarray:
        bucket = self.buckets[self.rng.choice(len(self.buckets), p=self.weights)]
        return self.rng.choice(bucket, size=min(self.batch_size, len(bucket)), replace=False)


def training_batch(
    data: EncodedScenes, index: np.ndarray, tokens: GridTokens, bos: int, pad: int, dropout: float, rng
) -> tuple[torch.Tensor, int]:
    """Input ids [B, T] and the position of BOI (the first image prediction)."""
    captions = torch.tensor([data.captions[i] for i in index])  # [B, P]: one length per batch
    drop = torch.from_numpy(rng.random(len(index)) < dropout)
    captions = torch.where(drop[:, None], torch.full_like(captions, pad), captions)
    n = len(index)
    prompt = torch.cat([torch.full((n, 1), bos), captions, torch.full((n, 1), tokens.boi_token_id)], dim=1)
    return torch.cat([prompt, image_sequence(data.codes[index], tokens)], dim=1), prompt.shape[1] - 1


def image_nll(model: LlamaForCausalLM, ids: torch.Tensor, boi: int) -> torch.Tensor:
    """Next-token cross-entropy of each image-part token, [B, T - boi - 1] (the prompt is given, not modelled)."""
    hidden = model.model(input_ids=ids[:, :-1]).last_hidden_state[:, boi:]  # predicts ids[:, boi + 1:]
    logits = model.lm_head(hidden)
    return F.cross_entropy(logits.transpose(1, 2).float(), ids[:, boi + 1 :], reduction="none")


def image_loss(model: LlamaForCausalLM, ids: torch.Tensor, boi: int) -> torch.Tensor:
    """Mean next-token cross-entropy over the image part, EOL and EOI included."""
    return image_nll(model, ids, boi).mean()


def training_device(name: str) -> torch.device:
    """The named device; by default cuda when there is one, else cpu."""
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def _warmup_steps(config: BackboneConfig) -> int:
    return 0 if config.resume else config.warmup_steps  # a resumed run is already warm


def schedule_progress(step: int, elapsed: float, config: BackboneConfig) -> float:
    """Fraction of the run after warm-up that is done, by steps or by the time budget, whichever is further."""
    warmup = _warmup_steps(config)
    progress = (step - warmup) / max(1, config.steps - warmup)
    if config.max_minutes > 0:
        progress = max(progress, elapsed / (60 * config.max_minutes))
    return min(progress, 1.0)


def decaying(step: int, elapsed: float, config: BackboneConfig) -> bool:
    """Whether a "wsd" run has reached its decay, where its state is saved for a later run to resume."""
    return config.schedule == "wsd" and schedule_progress(step, elapsed, config) >= 1 - config.decay_fraction


def learning_rate(step: int, elapsed: float, config: BackboneConfig) -> float:
    """Linear warm-up, then down to a tenth of `lr`: a cosine ("cosine"), or constant and a linear decay ("wsd")."""
    if step < _warmup_steps(config):
        return config.lr * (step + 1) / config.warmup_steps
    progress = schedule_progress(step, elapsed, config)
    if config.schedule == "wsd":
        decayed = max(0.0, progress - (1 - config.decay_fraction)) / config.decay_fraction
        return config.lr * (1 - 0.9 * decayed)
    if config.schedule == "cosine":
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
    raise ValueError(f"schedule must be 'cosine' or 'wsd', got {config.schedule!r}")


def train_backbone(
    config: BackboneConfig,
    vq: VQModel,
    tokenizer: PreTrainedTokenizerBase,
    data: EncodedScenes | None = None,
    state_folder: Path | None = None,
):
    """Returns (model, log). `data` defaults to the first `config.images` training scenes.

    A "wsd" run writes its state to `state_folder` where its decay begins; `config.resume`
    continues such a state with its Adam moments and step count, and no new warm-up.
    """
    if not 0 < config.decay_fraction <= 1:
        raise ValueError(f"decay_fraction must be in (0, 1], got {config.decay_fraction}")
    tokens = reference_grid_tokens(tokenizer, vq.config.num_vq_embeddings)
    started = time.perf_counter()
    device = training_device(config.device)
    cache = Path(config.scene_cache) if config.scene_cache else None
    data = data or cached_scenes(vq, tokenizer, training_seeds(config), cache, workers=config.render_workers)
    log = {"config": asdict(config), "encode_seconds": time.perf_counter() - started, "loss": []}
    model = build_backbone(config, tokens, tokenizer).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    first = load_optimizer_state(model, optimizer, Path(config.resume)) if config.resume else 0
    log["first_step"] = first
    # Offset by the steps already run, so that a resumed run draws new batches.
    buckets = LengthBuckets(data.captions, config.batch_size, config.seed + first)
    rng = np.random.default_rng(config.seed + 1 + first)
    started, recent = time.perf_counter(), []
    bar = progress_bar(config)
    for step in range(config.steps):
        elapsed = time.perf_counter() - started
        if config.max_minutes > 0 and elapsed > 60 * config.max_minutes:
            break
        if state_folder is not None and "state_step" not in log and decaying(step, elapsed, config):
            save_training_state(model, optimizer, first + step, state_folder)
            log["state_step"] = first + step
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, elapsed, config)
        ids, boi = training_batch(
            data, buckets.sample(), tokens, tokenizer.bos_token_id, tokenizer.pad_token_id, config.prompt_dropout, rng
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = image_loss(model, ids.to(device), boi)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent.append(loss.item())
        bar.update(min(time.perf_counter() - started, bar.total) - bar.n if config.max_minutes > 0 else 1)
        if (step + 1) % config.log_every == 0:
            entry = {
                "step": first + step + 1,
                "loss": float(np.mean(recent)),
                "lr": optimizer.param_groups[0]["lr"],
                "seconds": time.perf_counter() - started,
            }
            log["loss"].append(entry)
            bar.set_postfix(step=entry["step"], loss=f"{entry['loss']:.3f}", lr=f"{entry['lr']:.1e}")
            recent = []
    bar.close()
    log["steps_run"] = step + 1
    log["train_seconds"] = time.perf_counter() - started
    log["parameters"] = sum(p.numel() for p in model.parameters())
    return model.cpu().eval(), log


def progress_bar(config: BackboneConfig) -> tqdm:
    """Over the time budget when there is one (its ETA is then when the run stops), else over the steps;
    the latest logged loss, lr and step ride along."""
    if config.max_minutes > 0:
        return tqdm(total=round(60 * config.max_minutes), unit="s", desc="training (time budget)", bar_format=TIME_BAR)
    return tqdm(total=config.steps, unit="step", desc="training")


TIME_BAR = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vq", required=True, type=Path, help="the trained VQModel folder")
    parser.add_argument(
        "--out", required=True, type=Path, help="writes backbone/, tokenizer/, train_log.json (and state/ if wsd)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    for field, default in asdict(BackboneConfig()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = BackboneConfig(**{f: getattr(args, f) for f in asdict(BackboneConfig())})
    tokenizer = build_caption_tokenizer()
    vq = VQModel.from_pretrained(args.vq, use_safetensors=True).float().to(training_device(config.device)).eval()
    model, log = train_backbone(config, vq, tokenizer, state_folder=args.out / "state")
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out / "backbone")
    tokenizer.save_pretrained(args.out / "tokenizer")
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1))


if __name__ == "__main__":
    main()
