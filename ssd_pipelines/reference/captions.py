"""Print the captions of a range of scene seeds, one per line: the prompt lists of training and evaluation.

python -m ssd_pipelines.reference.captions --count 1000 --seed 0 > runs/distill_prompts.txt
"""

from __future__ import annotations

import argparse

from .scenes import sample_scene


def captions(count: int, seed: int = 0) -> list[str]:
    return [sample_scene(s).caption for s in range(seed, seed + count)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0, help="first scene seed (10**9 and up are held out)")
    args = parser.parse_args(argv)
    print("\n".join(captions(args.count, args.seed)))


if __name__ == "__main__":
    main()
