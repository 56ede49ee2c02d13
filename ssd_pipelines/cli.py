"""`ssd-generate`: one prompt to image files, with the decoding statistics printed.

ssd-generate "a red circle left of a blue square" --out out.png
ssd-generate "two green squares" --out out.png --decoding exact --json
ssd-generate "a blue ring" --out out.png --rounds 1 --compare      # AR beside it, speedup printed
ssd-generate "a blue ring" --out out.png --num-images 4 --compare --grid grid.png  # one labelled sheet of all

Existing files are never overwritten unless --overwrite is given. The decoding's options, their defaults and the
guidance scale come from the library and the model: nothing here decides them.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import PIL.Image
import torch

from .acceptance import format_rates
from .decoding import (
    DEFAULT_DECODING,
    STRATEGIES,
    USER_DECODINGS,
    check_options,
    decoding_label,
    options_for,
    strategy_class,
)
from .hub import HUB_MODEL, default_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ssd-generate", description=__doc__.splitlines()[0])
    parser.add_argument("prompt", help="what to draw")
    parser.add_argument("--out", required=True, type=Path, help="image file; with several images, -0, -1 ... are added")
    parser.add_argument(
        "--model", default=None, help=f"pipeline folder or Hub repository (default: {HUB_MODEL}, bundled copy first)"
    )
    peers = [n for n, cls in STRATEGIES.items() if cls.summary.startswith("peer")]  # their summaries say so
    ours = [n for n in STRATEGIES if n not in USER_DECODINGS and n not in peers]  # e.g. auto
    parser.add_argument(
        "--decoding",
        default=DEFAULT_DECODING,
        choices=list(STRATEGIES),
        help="; ".join(f"{name}: {strategy_class(name).summary}" for name in (*USER_DECODINGS, *ours))
        + f"; or a peer: {', '.join(n for n in STRATEGIES if n not in USER_DECODINGS and n not in ours)}",
    )
    for name, (option, takers) in decoding_options().items():
        default = "" if option.default is None else f", default {option.default}"
        parser.add_argument(
            option_flag(name),
            dest=name,
            metavar="N",
            type=int,
            default=None,
            help=f"--decoding {' or '.join(takers)}: {option.about}{default}",
        )
    parser.add_argument("--seed", type=int, default=0, help="seed of the torch.Generator")
    parser.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="classifier-free guidance scale (1 disables it; default: the model's own, 3 for the reference model)",
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--num-images", type=int, default=1, help="images for the prompt, decoded as one batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default on CPU: 1, fastest for the small reference model and on a busy machine)",
    )
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON on stdout")
    parser.add_argument(
        "--compare", action="store_true", help="also decode with ar (same prompt and seed), print the speedup"
    )
    parser.add_argument(
        "--grid", type=Path, default=None, help="also write one labelled sheet: a row per decoding, a column per image"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace image files that already exist")
    args = parser.parse_args(argv)
    if args.compare and args.decoding == "ar":
        others = ", ".join(d for d in USER_DECODINGS if d != "ar")
        parser.error(f"--compare sets the decoding beside ar: choose --decoding {others}")
    for name in decoding_options():
        try:
            check_options(args.decoding, **{name: getattr(args, name)})
        except ValueError as error:  # the library's words, under the flag the user typed
            parser.error(f"{option_flag(name)}: {error}")
    if args.num_images < 1:
        parser.error(f"--num-images must be >= 1, got {args.num_images}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    check_out(parser, args)
    return args


def decoding_options() -> dict:
    """Every option of the decodings, by name: (its declaration, the decodings that take it)."""
    found: dict = {}
    for decoding, cls in STRATEGIES.items():
        for option in cls.options:
            found.setdefault(option.name, (option, []))[1].append(decoding)
    return found


def option_flag(name: str) -> str:
    """The flag of a decoding option: --rounds for verify_rounds (the paper's r), else the name with dashes."""
    return "--rounds" if name == "verify_rounds" else "--" + name.replace("_", "-")


def check_out(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Before any work: the folder must be one we can write into, the file type one PIL writes, and no file may
    be overwritten unasked."""
    for path in (args.out, args.grid):
        blocking = next((p for p in (path.parents if path else ()) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            parser.error(f"cannot write {path}: {blocking} is a file, not a folder; choose another path")
    PIL.Image.init()
    suffix = args.out.suffix.lower()
    writable = sorted(e for e, f in PIL.Image.registered_extensions().items() if f in PIL.Image.SAVE)
    if suffix not in writable:
        parser.error(f"--out {args.out}: cannot write {suffix or 'files without an extension'}; use .png, .jpg, .webp")
    tags = [""] + (["-ar"] if args.compare else [])
    taken = [str(p) for tag in tags for p in output_paths(args.out, args.num_images, tag) if p.exists()]
    if args.grid is not None:
        if args.grid.suffix.lower() not in writable:
            parser.error(f"--grid {args.grid}: cannot write {args.grid.suffix or 'files without an extension'}")
        taken += [str(args.grid)] if args.grid.exists() else []
    if taken and not args.overwrite:
        parser.error(f"{', '.join(taken)} already exist: pass --overwrite to replace them, or choose another --out")


def output_paths(out: Path, count: int, tag: str = "") -> list[Path]:
    if count == 1:
        return [out.with_name(f"{out.stem}{tag}{out.suffix}")]
    return [out.with_name(f"{out.stem}{tag}-{i}{out.suffix}") for i in range(count)]


def generate(pipe, args: argparse.Namespace, decoding: str) -> tuple[dict, list[str]]:
    """One decoding run; saves its images and returns its statistics and files."""
    with warnings.catch_warnings():  # the output's warnings are printed once, below, not also as Python warnings
        warnings.simplefilter("ignore", UserWarning)
        out = pipe(
            args.prompt,
            num_images_per_prompt=args.num_images,
            guidance_scale=args.guidance,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=torch.Generator().manual_seed(args.seed),  # on the CPU: the same seed, the same codes anywhere
            decoding=decoding,
            **options_for(decoding, **{name: getattr(args, name) for name in decoding_options()}),
        )
    for warning in out.warnings:
        print(f"ssd-generate: warning: {warning}", file=sys.stderr)
    paths = output_paths(args.out, len(out.images), "" if decoding == args.decoding else f"-{decoding}")
    for image, path in zip(out.images, paths):
        image.save(path)
    return {**out.stats, "warnings": out.warnings}, [str(p) for p in paths], out.images


def describe(stats: dict, files: list[str]) -> str:
    acceptance = format_rates(stats["acceptance_per_round"])
    return (
        f"{decoding_label(stats)}: {stats['forward_passes']} forward passes, {stats['seconds']:.2f} s, "
        f"acceptance per round {acceptance} -> {', '.join(files)}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    from .pipeline_ssd import SSDAutoregressivePipeline  # after parsing: --help stays fast

    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"ssd-generate: error: cannot create the folder of --out {args.out}: {error.strerror}", file=sys.stderr)
        return 2
    # Weights ship in fp16; CPUs compute fp32 far faster.
    dtype = torch.float32 if args.device == "cpu" else torch.float16
    try:
        pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), dtype=dtype).to(args.device)
        pipe.set_progress_bar_config(disable=args.json)
        stats, files, images = generate(pipe, args, args.decoding)
    except ValueError as error:  # bad input: the message says what to change
        print(f"ssd-generate: error: {error}", file=sys.stderr)
        return 2
    guidance = pipe.image_backbone.default_guidance_scale if args.guidance is None else args.guidance
    report = {"prompt": args.prompt, "guidance_scale": guidance, "decoding": stats, "files": files}
    lines = [describe(stats, files)]
    sheet = {row_label(args, args.decoding, stats): images}
    if args.compare:
        baseline, baseline_files, baseline_images = generate(pipe, args, "ar")
        sheet[row_label(args, "ar", baseline)] = baseline_images
        report["ar"] = {**baseline, "files": baseline_files}
        report["speedup"] = {
            "forward_passes": baseline["forward_passes"] / stats["forward_passes"],
            "seconds": baseline["seconds"] / stats["seconds"],
        }
        lines += [
            describe(baseline, baseline_files),
            (
                f"speedup over ar: {report['speedup']['forward_passes']:.1f}x fewer forward passes, "
                f"{report['speedup']['seconds']:.1f}x less time"
            ),
        ]
    if args.grid is not None:
        write_sheet(sheet, args)
        report["grid"] = str(args.grid)
        lines.append(f"sheet -> {args.grid}")
    print(json.dumps(report, indent=2) if args.json else "\n".join(lines))
    return 0


def row_label(args: argparse.Namespace, decoding: str, stats: dict) -> str:
    rounds = f" r={args.verify_rounds}" if decoding == "ssd" and args.verify_rounds is not None else ""
    return f"{decoding_label(stats)}{rounds}, {stats['forward_passes']} passes"


def write_sheet(rows: dict[str, list], args: argparse.Namespace) -> None:
    """The images of every decoding on one labelled sheet: a row per decoding, a column per image."""
    from .benchmarks.plots import image_grid

    arrays = {label: np.stack([np.asarray(image.convert("RGB")) for image in images]) for label, images in rows.items()}
    captions = [f"image {i}, seed {args.seed}" for i in range(args.num_images)]
    args.grid.parent.mkdir(parents=True, exist_ok=True)
    image_grid(arrays, captions, args.grid)


if __name__ == "__main__":
    sys.exit(main())
