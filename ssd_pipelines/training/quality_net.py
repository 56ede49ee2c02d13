"""Train the quality network: a classifier of colours, shapes and object count on the procedural scenes.

Its penultimate features are what `ssd-bench peers` compares with a Fréchet
distance (`reference/quality.py`). It sees real renders of the training split
only (seeds below 10**9), as Inception saw only real photographs; it is checked
on held-out renders (`docs/quality_network.md`).

    python -m ssd_pipelines.training.quality_net --out ssd_pipelines/reference/quality_net.safetensors
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.nn import functional as F
from tqdm import tqdm

from ..reference.quality import WEIGHTS, SceneClassifier, as_batch, scene_targets
from ..reference.scenes import COLORS, HELDOUT_SEED_START, SHAPES, make_dataset


def scenes_as_tensors(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rendered scenes of seeds seed..seed + count - 1 -> images [N, 3, 64, 64], targets [N, 13]."""
    scenes = make_dataset(count, seed)
    return as_batch([s.image for s in scenes]), torch.stack([scene_targets(s.spec) for s in scenes])


def losses(net: SceneClassifier, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy on colours and shapes present, cross-entropy on the object count."""
    attributes, count = net(images)
    return F.binary_cross_entropy_with_logits(attributes, targets[:, :-1]) + F.cross_entropy(
        count, targets[:, -1].long()
    )


@torch.no_grad()
def accuracy(net: SceneClassifier, images: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Held-out accuracy per head: every colour right, every shape right, the count right."""
    attributes, count = net(images)
    present = attributes > 0
    colours = len(COLORS)
    return {
        "colours": float((present[:, :colours] == targets[:, :colours].bool()).all(1).float().mean()),
        "shapes": float((present[:, colours:] == targets[:, colours:-1].bool()).all(1).float().mean()),
        "count": float((count.argmax(1) == targets[:, -1].long()).float().mean()),
    }


def train(scenes: int, epochs: int, batch_size: int, lr: float, seed: int) -> tuple[SceneClassifier, dict]:
    torch.manual_seed(seed)
    images, targets = scenes_as_tensors(scenes, seed)
    held_images, held_targets = scenes_as_tensors(1000, HELDOUT_SEED_START + 500_000)
    net = SceneClassifier()
    optimiser = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    steps = epochs * (scenes // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=lr, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    with tqdm(total=steps, desc="quality net", unit="step") as progress:
        for _ in range(epochs):
            order = torch.randperm(scenes, generator=generator)
            for start in range(0, scenes - batch_size + 1, batch_size):
                index = order[start : start + batch_size]
                batch = images[index]
                flip = torch.rand(len(index), generator=generator) < 0.5  # a mirrored scene has the same labels
                batch = torch.where(flip[:, None, None, None], batch.flip(-1), batch)
                loss = losses(net, batch, targets[index])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                schedule.step()
                progress.update()
                progress.set_postfix(loss=f"{loss.item():.3f}")
    net.eval()
    return net, accuracy(net, held_images, held_targets)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=WEIGHTS)
    parser.add_argument("--scenes", type=int, default=40_000, help="training renders (seeds 0..)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    net, held_out = train(args.scenes, args.epochs, args.batch_size, args.lr, args.seed)
    save_file({k: v.half().contiguous() for k, v in net.state_dict().items()}, str(args.out))
    minutes = (time.perf_counter() - started) / 60
    print(f"held-out accuracy {held_out}; {minutes:.1f} min; wrote {args.out} ({args.out.stat().st_size} bytes)")
    print(f"shapes: {', '.join(SHAPES)}; colours: {', '.join(COLORS)}")


if __name__ == "__main__":
    main()
