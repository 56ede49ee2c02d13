"""Loss curves of training logs, as one small PNG beside the tables in docs/ (a reader would rather look than read).

    python -m ssd_pipelines.training.plot_logs --out docs/heads_loss.png \
        "v4 heads=docs/logs/distill_v4_heads_log.json" "v6 heads=docs/history/logs/distill_log.json"

Reads the logs our trainers write: the distillation's `loss` as [step, loss] pairs, the backbone's and
the VQ's as dicts with `step` and `loss` or as a bare list (one entry per logged step). matplotlib is the
optional `[bench]` extra. Runs of different batch sizes (a CPU run's 32, a GPU run's 256) compare by the
sequences they have seen: `--x sequences` (log scale).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..plots import pyplot


def loss_curve(log: dict, x: str = "step") -> tuple[list[float], list[float]]:
    """(steps, losses) of a training log, whichever of our trainers wrote it; x="sequences" counts
    the sequences seen instead (steps x the batch size in the log's config)."""
    entries = log.get("loss")
    if not entries:
        raise ValueError("the log has no 'loss' entries: is it a training log of ssd_pipelines.training?")
    if x == "sequences":
        batch = log.get("config", {}).get("batch_size")
        if not batch or not isinstance(entries[0], dict):
            raise ValueError("--x sequences needs a backbone training log (its config names the batch size)")
        return [e["step"] * batch for e in entries], [e["loss"] for e in entries]
    if isinstance(entries[0], dict):
        return [e["step"] for e in entries], [e["loss"] for e in entries]
    if isinstance(entries[0], (list, tuple)):
        return [e[0] for e in entries], [e[1] for e in entries]
    return list(range(len(entries))), list(entries)


def plot(
    curves: dict[str, tuple[list[float], list[float]]],
    out: Path,
    title: str,
    x: str = "step",
    ymax: float | None = None,
) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, (steps, losses) in curves.items():
        ax.plot(steps, losses, linewidth=1.3, label=label)
    ax.set_xlabel("sequences seen" if x == "sequences" else "training step")
    if x == "sequences":
        ax.set_xscale("log")
    ax.set_ylabel("loss")
    ax.set_title(title)
    if ymax is not None:  # a run from scratch starts far above where the others compare
        ax.set_ylim(top=ymax)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", help="LABEL=PATH of a training log (JSON); PATH alone uses its name")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="Training loss")
    parser.add_argument("--x", choices=("step", "sequences"), default="step", help="the horizontal axis")
    parser.add_argument("--ymax", type=float, default=None, help="cut the loss axis here")
    args = parser.parse_args(argv)
    curves = {}
    for spec in args.logs:
        label, _, path = spec.rpartition("=")
        path = Path(path)
        if not path.is_file():
            raise SystemExit(f"no training log at {path}: pass LABEL=PATH of a JSON log under docs/logs/")
        curves[label or path.stem] = loss_curve(json.loads(path.read_text()), args.x)
    plot(curves, args.out, args.title, args.x, args.ymax)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
