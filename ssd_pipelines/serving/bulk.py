"""Bulk generation on Ray Data: one image per line of a prompts file, by an actor pool of pipelines, resumable.

python -m ssd_pipelines.serving.bulk prompts.txt --out DIR
python -m ssd_pipelines.serving.bulk prompts.txt --out DIR --decoding exact --seed 7 --batch-size 8 --workers 2
python -m ssd_pipelines.serving.bulk prompts.txt --out DIR --address auto --gpus-per-worker 1

Prompt N (its line in the file, from 0; blank lines draw nothing) is drawn from the seed + N, so an image does
not depend on the batch it ran in nor on the run. Rerun after a crash with the same options: the prompts already
in DIR are skipped (serving/bulk_store.py says what is kept where). Exit status 1 when a prompt failed (its error
is in stats.jsonl, and the next run tries it again) or a write failed midway (a full disk: what was drawn is kept),
2 for bad options, a prompts file that is not text, or an --out it cannot make or write.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from ..decoding.catalog import DECODINGS, DEFAULT_DECODING, check_options, decoding_options
from ..sampling_config import SamplingConfig
from ..seeds import check_seed
from .bulk_store import BulkOutput


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ssd_pipelines.serving.bulk", description=__doc__.splitlines()[0])
    parser.add_argument("prompts", type=Path, help="a text file, one prompt a line")
    parser.add_argument("--out", type=Path, required=True, help="folder of images/, stats.jsonl and job.json")
    parser.add_argument(
        "--model", default=None, help="pipeline folder or Hub repository (default: the reference model)"
    )
    parser.add_argument("--decoding", default=DEFAULT_DECODING, choices=list(DECODINGS))
    for name, (option, takers) in decoding_options().items():
        parser.add_argument(
            option_flag(name),
            dest=name,
            type=int,
            default=None,
            metavar="N",
            help=f"--decoding {' or '.join(takers)}: {option.about}",
        )
    parser.add_argument("--seed", type=int, default=0, help="prompt N is drawn from seed + N (default 0)")
    parser.add_argument("--guidance", type=float, default=None, help="default: the model's own scale")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=4, help="prompts a worker decodes in one call (default 4)")
    parser.add_argument("--workers", type=int, default=1, help="actors, each holding one pipeline (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    parser.add_argument("--cpus-per-worker", type=float, default=None, help="Ray CPUs per worker (default: --threads)")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help="Ray GPUs per worker (default 0)")
    parser.add_argument("--address", default=None, help="a Ray cluster to join ('auto'); default: start a local one")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    args = parser.parse_args(argv)
    for name in ("batch_size", "workers", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.prompts.is_file():
        parser.error(f"{args.prompts} is not a file")
    try:  # the library's checks, before anything starts
        check_options(args.decoding, **decoding_values(args))
        SamplingConfig(args.temperature, args.top_k, args.top_p, 1.0 if args.guidance is None else args.guidance)
        check_seed(args.seed, len(prompt_lines(args.prompts)), "--seed")  # prompt N draws from seed + N
    except ValueError as error:
        parser.error(str(error))
    return args


def decoding_values(args: argparse.Namespace) -> dict:
    return {name: getattr(args, name) for name in decoding_options() if getattr(args, name) is not None}


def settings(args: argparse.Namespace) -> dict:
    """What an image depends on: a rerun into the same folder must have the same."""
    from .loader import model_name  # imports torch: not on the way to --help

    return {
        "model": model_name(args.model),
        "decoding": args.decoding,
        "options": decoding_values(args),
        "seed": args.seed,
        "guidance_scale": args.guidance,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
    }


def prompt_lines(path: Path) -> list[str]:
    """The lines of a prompts file; a ValueError naming the file when it is not text."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text (byte 0x{data[error.start]:02x} at position {error.start}): give a text file "
            "of prompts, one a line, encoded in UTF-8."
        ) from None
    if "\x00" in text:
        raise ValueError(
            f"{path} holds NUL bytes at position {text.index(chr(0))}, as binary files do: give a text file of "
            "prompts, one a line."
        )
    return text.splitlines()


def read_prompts(path: Path) -> dict[int, str]:
    return {index: line.strip() for index, line in enumerate(prompt_lines(path)) if line.strip()}


class BulkWorker:
    """One actor of the pool: a pipeline, and a batch of prompts -> their PNGs and records."""

    def __init__(self, job: dict, threads: int):
        from .loader import load_worker_pipeline

        self.job = job
        self.pipe = load_worker_pipeline(job["model"], threads=threads)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from .batching import run_batch
        from .request import GenerateRequest, prepare
        from .responses import png_bytes

        job = self.job
        fields = {
            "decoding": job["decoding"],
            **job["options"],
            "guidance_scale": job["guidance_scale"],
            "temperature": job["temperature"],
            "top_k": job["top_k"],
            "top_p": job["top_p"],
        }
        indices = [int(i) for i in batch["index"]]
        outcomes: dict[int, object] = {}
        jobs, owners = [], []
        for index, prompt in zip(indices, batch["prompt"]):
            try:
                jobs.append(prepare(self.pipe, GenerateRequest(prompt=str(prompt), seed=job["seed"] + index, **fields)))
                owners.append(index)
            except ValueError as error:
                outcomes[index] = error
        for index, outcome in zip(owners, run_batch(self.pipe, jobs)):
            outcomes[index] = outcome
        pngs, records = [], []
        for index, prompt in zip(indices, batch["prompt"]):
            outcome = outcomes[index]
            record = {"index": index, "prompt": str(prompt), "seed": job["seed"] + index}
            if isinstance(outcome, Exception):
                pngs.append(b"")
                record["error"] = f"{type(outcome).__name__}: {outcome}"
            else:
                pngs.append(png_bytes(outcome.images[0]))
                record.update(stats=outcome.stats, warnings=outcome.warnings)
            records.append(json.dumps(record))
        return {"index": np.array(indices), "png": np.array(pngs, dtype=object), "record": np.array(records)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    output, job = BulkOutput(args.out), settings(args)
    prompts = read_prompts(args.prompts)
    try:
        output.claim(job)
        done = output.finished(prompts)
    except ValueError as error:
        print(f"bulk: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"bulk: error: cannot write to --out {args.out} ({_reason(error)}): {_remedy(error)}", file=sys.stderr)
        return 2
    todo = [(index, prompt) for index, prompt in prompts.items() if index not in done]
    print(f"bulk: {len(prompts)} prompts, {len(done)} drawn already, {len(todo)} to draw -> {args.out}", flush=True)
    if not todo:
        return 0
    try:
        failed = draw(args, job, output, todo, len(prompts), len(done))
    except OSError as error:
        if error.filename is None or not Path(error.filename).is_relative_to(args.out):
            raise  # not the output folder's: a fault, with its traceback
        kept = len(output.finished(prompts))
        print(
            f"bulk: error: cannot write {error.filename} ({_reason(error)}): the {kept} images drawn are kept in "
            f"{args.out}; {_remedy(error)}, and run the same command again: it draws only the prompts not drawn yet.",
            file=sys.stderr,
        )
        return 1
    if failed:
        print(
            f"bulk: {failed} prompts failed (errors in {output.stats_path}); rerun to try them again", file=sys.stderr
        )
    return 1 if failed else 0


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def _remedy(error: OSError) -> str:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space there or choose another --out"
    return "make it a folder this user can write, or choose another --out"


def draw(args: argparse.Namespace, job: dict, output: BulkOutput, todo: list, total: int, done: int) -> int:
    """Run the Ray Data job over the prompts not drawn yet, storing each as it comes; return how many failed."""
    import ray
    from tqdm import tqdm

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus or os.cpu_count(), include_dashboard=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False  # the bar below counts images
        items = [{"index": index, "prompt": prompt} for index, prompt in todo]
        dataset = ray.data.from_items(items, override_num_blocks=math.ceil(len(items) / args.batch_size))
        remote = {"num_cpus": args.threads if args.cpus_per_worker is None else args.cpus_per_worker}
        if args.gpus_per_worker:
            remote["num_gpus"] = args.gpus_per_worker
        drawn = dataset.map_batches(
            BulkWorker,
            fn_constructor_kwargs={"job": job, "threads": args.threads},
            batch_size=args.batch_size,
            compute=ray.data.ActorPoolStrategy(size=args.workers),  # Ray 2.51+'s spelling of concurrency=
            batch_format="numpy",
            **remote,
        )
        with tqdm(total=total, initial=done, unit="image", desc="bulk") as bar:
            return store(output, drawn.iter_batches(batch_size=None, batch_format="numpy"), bar)
    finally:
        ray.shutdown()


def store(output: BulkOutput, batches, bar) -> int:
    """Store each drawn batch's images and records as they come; return how many prompts failed."""
    run, failed = uuid.uuid4().hex[:12], 0
    with open(output.stats_path, "a") as log:
        for batch in batches:
            for index, png, record in zip(batch["index"], batch["png"], batch["record"]):
                record = {**json.loads(record), "run": run, "time": time.time()}
                output.write(log, int(index), bytes(png), record)
                failed += "error" in record
                bar.update()
    return failed


if __name__ == "__main__":
    sys.exit(main())
