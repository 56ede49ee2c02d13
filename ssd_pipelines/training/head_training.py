"""The training loop of self-distillation: AdamW on the heads, DDP-averaged across processes.

Every process trains on its own shard of the data, with DDP averaging the heads'
gradients at every step (see distill.py for why the data is not gathered).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from ..backbones.base import ImageBackbone
from ..heads import DraftHeads
from ..sampling_config import SamplingConfig
from .distill_data import DistillationData
from .head_loss import HeadLosses, batch_loss, trained_offsets


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
    loss: str = "smooth_l1",
    sampling: SamplingConfig | None = None,
    true_state_share: float = 0.0,
) -> dict:
    """Train `heads` in place with AdamW on this process's `data`; returns a JSON-ready log.

    Under several processes DDP averages gradients every step, so every process
    must run the same number of steps. The backbone is only read (under no_grad)
    and never reaches the optimizer. The loss curve holds [step, loss] averaged
    over the steps since the previous entry and over processes; the first entry
    is step 0 alone, the untrained loss. `final_per_head` splits the last entry by head.
    loss, sampling, true_state_share: see `HeadLosses` (the distribution losses compare p and q under `sampling`).
    """
    if steps < 1 or len(data) == 0:
        raise ValueError(f"training needs steps >= 1 and some data, got steps={steps} and {len(data)} images.")
    accelerator = accelerator or Accelerator()
    heads.train()
    optimizer = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=lr)  # frozen heads stay
    # Not prepared: accelerate would step a prepared scheduler once per process, and every process runs all steps.
    scheduler = _schedule(optimizer, schedule, steps)
    objective, optimizer = accelerator.prepare(HeadLosses(heads, loss, backbone, sampling, true_state_share), optimizer)
    batches = _batches(len(data), batch_size, torch.Generator().manual_seed(seed + accelerator.process_index))
    names = [name for name, _, _ in trained_offsets(heads)]
    log: dict = {"loss": [], "final_per_head": {}, "steps": 0}
    window: list[torch.Tensor] = []
    bar = tqdm(range(steps), desc="training heads", unit="step", disable=not accelerator.is_main_process)
    for step in bar:
        total, per_head = batch_loss(objective, backbone, data[next(batches)])
        accelerator.backward(total)
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
