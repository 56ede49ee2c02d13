"""`ssd-generate`: one prompt to image files, with the decoding statistics printed.

ssd-generate "a red circle left of a blue square" --out out.png
ssd-generate "two green squares" --out out.png --decoding exact --json
ssd-generate "a blue ring" --out out.png --rounds 1 --compare      # AR beside it, speedup printed
ssd-generate "a blue ring" --out out.png --num-images 4 --compare --grid grid.png  # one labelled sheet of all

Existing files are never overwritten unless --overwrite is given. The decoding's options, their defaults and the
guidance scale come from the library and the model: nothing here decides them. Parsing the arguments imports no
torch (main loads it with the model), so --help and a usage error answer at once.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import warnings
from pathlib import Path

from .decoding.catalog import (
    DECODINGS,
    DEFAULT_DECODING,
    USER_DECODINGS,
    check_options,
    decoding_label,
    decoding_options,
    options_for,
)
from .devices import DEFAULT_HELP, check_device, device_type
from .precisions import add_dtype_argument, check_precision, default_precision
from .seeds import check_seed
from .speedup import against_ar


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ssd-generate", description=__doc__.splitlines()[0])
    parser.add_argument("prompt", help="what to draw")
    parser.add_argument("--out", required=True, type=Path, help="image file; with several images, -0, -1 ... are added")
    parser.add_argument(
        "--model",
        default=None,
        help="pipeline folder or Hub repository (default: the reference model, the bundled copy first: offline)",
    )
    offered = [*USER_DECODINGS, *(n for n, info in DECODINGS.items() if n not in USER_DECODINGS and not info.peer)]
    parser.add_argument(
        "--decoding",
        default=DEFAULT_DECODING,
        choices=list(DECODINGS),
        help="; ".join(f"{name}: {DECODINGS[name].summary}" for name in offered)
        + f"; or a peer: {', '.join(n for n, info in DECODINGS.items() if info.peer)}",
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
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the torch.Generator the batch draws from, 0 to 2**64 - 1"
    )
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
    parser.add_argument(
        "--device", default=None, help=f"torch device, e.g. cpu, cuda, cuda:1 (default: {DEFAULT_HELP})"
    )
    add_dtype_argument(parser)
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
    try:
        check_seed(args.seed, name="--seed")  # the batch draws from one generator seeded --seed
        check_out(args)
        args.device = check_device(args.device)  # the one check that imports torch: the last
        args.dtype = args.dtype or default_precision(device_type(args.device))
        check_precision(args.dtype, device_type(args.device))
    except ValueError as error:
        parser.error(str(error))
    return args


def option_flag(name: str) -> str:
    """The flag of a decoding option: --rounds for verify_rounds (the paper's r), else the name with dashes."""
    return "--rounds" if name == "verify_rounds" else "--" + name.replace("_", "-")


def check_out(args: argparse.Namespace) -> None:
    """Before any work, a ValueError unless every file can be written: its type one PIL writes, its folder one we
    can write into (or create), and no file overwritten unasked."""
    import PIL.Image

    PIL.Image.init()
    writable = sorted(e for e, f in PIL.Image.registered_extensions().items() if f in PIL.Image.SAVE)
    for flag, path in (("--out", args.out), ("--grid", args.grid)):
        if path is None:
            continue
        if path.suffix.lower() not in writable:
            raise ValueError(
                f"{flag} {path}: cannot write {path.suffix or 'files without an extension'}; use .png, .jpg, .webp"
            )
        check_folder(flag, path)
    tags = [""] + (["-ar"] if args.compare else [])
    if args.grid is not None and is_output(args.grid, args.out, args.num_images, tags):
        raise ValueError(
            f"--grid {args.grid} is also the name of an image file of --out {args.out}: choose another --grid"
        )
    folder = args.out.absolute().parent
    taken = (
        sorted(p for p in folder.iterdir() if is_output(p, args.out, args.num_images, tags)) if folder.is_dir() else []
    )
    taken += [args.grid] if args.grid is not None and args.grid.exists() else []
    if taken and not args.overwrite:
        names = ", ".join(map(str, taken[:5])) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        verb, them = ("exists", "it") if len(taken) == 1 else ("exist", "them")
        raise ValueError(f"{names} already {verb}: pass --overwrite to replace {them}, or choose another --out")


def is_output(path: Path, out: Path, count: int, tags: list[str]) -> bool:
    """Whether `path` is one of the `count` image files `output_paths` makes of `out` with one of `tags`, read off
    its name: a folder's files are few, while --num-images may ask for millions of names."""
    if path.absolute().parent != out.absolute().parent:
        return False
    for tag in tags:
        stem = re.escape(f"{out.stem}{tag}")
        if count == 1 and path.name == f"{out.stem}{tag}{out.suffix}":
            return True
        index = re.fullmatch(stem + r"-(0|[1-9][0-9]*)" + re.escape(out.suffix), path.name)
        if count > 1 and index is not None and int(index[1]) < count:
            return True
    return False


def check_folder(flag: str, path: Path) -> None:
    """A ValueError unless `path`'s folder takes a new file, or the nearest folder that exists takes the new folders.
    Tried with a temporary file, not read from permission bits, which do not hold for root or a read-only mount."""
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ValueError(f"cannot write {path}: {blocking} is a file, not a folder; choose another path")
    folder = path.absolute().parent
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".ssd-generate-"):
            pass
    except OSError as error:
        needs = "write files" if existing == folder else f"create the folder {folder}"
        raise ValueError(
            f"{flag} {path}: cannot {needs} in {existing} ({error.strerror}); choose a folder you can write to"
        ) from None


def output_paths(out: Path, count: int, tag: str = "") -> list[Path]:
    if count == 1:
        return [out.with_name(f"{out.stem}{tag}{out.suffix}")]
    return [out.with_name(f"{out.stem}{tag}-{i}{out.suffix}") for i in range(count)]


def generate(pipe, args: argparse.Namespace, decoding: str) -> tuple[dict, list[str]]:
    """One decoding run; saves its images and returns its statistics and files."""
    import torch

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
    from .acceptance import format_rates

    acceptance = format_rates(stats["acceptance_per_round"])
    return (
        f"{decoding_label(stats)}: {stats['forward_passes']} forward passes, {stats['seconds']:.2f} s, "
        f"acceptance per round {acceptance} -> {', '.join(files)}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from .hub import default_model
    from .pipeline_ssd import SSDAutoregressivePipeline
    from .quantization import precision_options

    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)

    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"ssd-generate: error: cannot create the folder of --out {args.out}: {error.strerror}", file=sys.stderr)
        return 2
    try:
        options = precision_options(args.dtype, args.device)
        pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), **options).to(args.device)
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
        lines += [describe(baseline, baseline_files), f"{decoding_label(stats)}: {against_ar(stats, baseline)}"]
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
    import numpy as np

    from .plots import image_grid

    arrays = {label: np.stack([np.asarray(image.convert("RGB")) for image in images]) for label, images in rows.items()}
    captions = [f"image {i}, seed {args.seed}" for i in range(args.num_images)]
    args.grid.parent.mkdir(parents=True, exist_ok=True)
    image_grid(arrays, captions, args.grid)


if __name__ == "__main__":
    sys.exit(main())
