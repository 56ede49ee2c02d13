"""The GPU measurement of issue 39 in one command: what the decodings cost on a GPU, and how far from the targets.

Sections, each time-boxed within --deadline (checked between measurements; a section that runs out of time or
raises is recorded so, and the others still run; gpu.json is rewritten after every measurement):

  A  the shipped reference model on the device, fp32 and bf16: seconds per image, passes and seconds per pass of
     ar, exact, ssd r=1 and r=2 for 1 and 16 images, and the greedy check (exact and uncapped ssd == ar);
  B  Janus-Pro-7B's shape with random bf16 weights: the bare pass at widths 1 and 24, each vertical drafter's row,
     and each decoding end to end for one image against the bare pass of its width;
  C  projections: AR against SSD at the paper's pass counts and at the reference model's measured pass ratios;
  E  host syncs of B's decodes: counted by `host_syncs`, and on CUDA named by torch's sync debug mode;
  Q  (only when asked: --sections Q) the 7B shape in int8 and nf4 beside bf16: memory, pass costs, whether it fits
     8 and 12 GiB (`gpu_quantized.py`).

D (peak memory per section, CUDA only) and F (issue 39's targets) follow from what ran.

    ssd-bench gpu                 # on a GPU, about 9 minutes -> docs/gpu.md and docs/gpu.json
    ssd-bench gpu --sections Q --out docs/gpu_quantized   # the quantized 7B shape, about 4 minutes
    ssd-bench gpu --tiny          # the same code paths on the CPU (a tiny Janus, fewer repeats), under a minute
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import diffusers
import torch
import transformers
from tqdm.auto import tqdm

import ssd_pipelines
from ssd_pipelines.backbones.prompts import left_padded_batch
from ssd_pipelines.decoding import make_strategy
from ssd_pipelines.heads import VERTICAL_DRAFTERS, DraftHeads
from ssd_pipelines.hub import default_model
from ssd_pipelines.pipeline_ssd import SSDAutoregressivePipeline
from ssd_pipelines.sampling_config import SamplingConfig
from ssd_pipelines.testing.engine_probes import ssd_row_draft

from . import backbone_speed as bs
from . import commands, report
from .gpu_quantized import quantized_section
from .gpu_report import SECTIONS, TITLE, markdown, targets

PROMPT = "a red circle left of a blue square"
DTYPES = ("float32", "bfloat16")
REFERENCE_DECODINGS: dict[str, dict] = {
    "ar": {"decoding": "ar"},
    "exact": {"decoding": "exact"},
    "ssd r=1": {"decoding": "ssd", "verify_rounds": 1},
    "ssd r=2": {"decoding": "ssd", "verify_rounds": 2},
}
GREEDY_DECODINGS = {"ar": ("ar", {}), "exact": ("exact", {}), "ssd, no cap": ("ssd", {"verify_rounds": None})}
# label -> (decoding, vertical drafter of its heads, options); the drafters' rows are per-cell and recurrent
JANUS_DECODINGS: dict[str, tuple[str, str | None, dict]] = {
    "ar": ("ar", None, {}),
    "ssd r=2, cell": ("ssd", "cell", {"verify_rounds": 2}),
    "exact, cell": ("exact", "cell", {}),
    "ssd r=2, recurrent": ("ssd", "recurrent", {"verify_rounds": 2}),
    "exact, recurrent": ("exact", "recurrent", {}),
}
# How B's decodings run: eager; the passes and the steps between them through torch.compile (`compile_passes`); or
# that with static shapes replayed as CUDA graphs (mode="reduce-overhead"; inductor skips the graphs that write tensors
# it does not hold at fixed addresses, and says so: B counts its skips)
MODES = {"eager": None, "compiled": {"dynamic": True}, "captured": {"mode": "reduce-overhead", "dynamic": False}}
PACKAGE = Path(ssd_pipelines.__file__).resolve().parent
# of --deadline, by the sections' length on an H200; Q is not a default section (--sections Q), and takes all of
# the deadline when it runs alone
SHARES = {"A": 0.2, "B": 0.45, "C": 0.0, "E": 0.35, "Q": 0.35}


def mode_options(mode: str, tiny: bool) -> dict | None:
    """MODES[mode]; with --tiny traced by the "eager" backend, which checks the path (the shapes, the steps) in
    seconds where inductor would take minutes."""
    options = MODES[mode]
    if options is None or not tiny:
        return options
    return {"dynamic": options.get("dynamic", False), "backend": "eager"}


def cudagraph_skips() -> int:
    """Graphs inductor was asked to capture as CUDA graphs and ran without (a counter since the process began)."""
    return torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


class OutOfTime(Exception):
    """A section reached its time box before the measurement named."""


class JanusShape:
    """Janus-Pro-7B's shape with random weights, built once for sections B and E: the backbone, heads of each
    drafter kind (made when first asked for), and a one-image prompt batch with Janus's guidance."""

    def __init__(self, tiny: bool, device: torch.device):
        started = time.perf_counter()
        self.backbone, cell = bs.build(bs.janus_pro_config(tiny), device, torch.float32 if tiny else torch.bfloat16)
        self.build_seconds = time.perf_counter() - started
        self.heads = {"cell": cell}
        ids = torch.randint(3, 100, (2, bs.PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
        pad, grid = self.backbone.pad_token_id, self.backbone.grid
        self.batch = left_padded_batch(ids[:1].tolist(), ids[1:].tolist(), 1, pad, grid)
        self.sampling = SamplingConfig(guidance_scale=self.backbone.default_guidance_scale)

    def heads_of(self, kind: str) -> DraftHeads:
        """Random heads of this shape with the `kind` vertical drafter (one vertical offset for the row kinds)."""
        if kind not in self.heads:
            b, default = self.backbone, torch.get_default_dtype()
            torch.set_default_dtype(b.dtype)  # made in the backbone's dtype on its device, as `build` makes its heads
            try:
                with torch.device(b.device):
                    heads = DraftHeads(
                        b.hidden_size, b.embed_size, b.grid.codebook_size, vertical_offsets=(1,), vertical_drafter=kind
                    )
            finally:
                torch.set_default_dtype(default)
            self.heads[kind] = heads.eval()
        return self.heads[kind]

    def decode(self, label: str):
        """One image decoded by JANUS_DECODINGS[label]."""
        name, kind, options = JANUS_DECODINGS[label]
        strategy = make_strategy(name, None if kind is None else self.heads_of(kind), **options)
        return strategy.decode(self.backbone, self.batch, self.sampling, torch.Generator().manual_seed(1))

    def timed_decode(self, label: str) -> tuple[int, float]:
        """Passes and seconds of one decode, synchronized on either side (one run: a 7B `ar` takes most of a
        minute; the bare passes before it warmed the backbone)."""
        decoded = []
        seconds = bs.median_seconds(lambda: decoded.append(self.decode(label)), self.backbone.device, 1, warmup=0)
        return decoded[0].stats.forward_passes, seconds

    @torch.inference_mode()
    def draft_row_seconds(self, kind: str, repeats: int) -> float:
        """Seconds block `ssd` takes to draft the second row and sample its codes (`ssd_row_draft`): the calls it
        makes per row (drafter, the backbone's output head, sampling; an in-row drafter left to right)."""
        draft = ssd_row_draft(self.heads_of(kind), self.backbone, self.batch, self.sampling)
        return bs.median_seconds(draft, self.backbone.device, repeats)

    def pass_bytes(self) -> int:
        """Bytes of the weights a 1-token pass reads: the language model's layers and the image generation head
        (token embeddings are gathered, not read whole)."""
        model = self.backbone.model.model
        parts = (model.language_model.layers, model.language_model.norm, model.generation_head)
        return sum(p.numel() * p.element_size() for part in parts for p in part.parameters())


class Run:
    """One `ssd-bench gpu` run: the device, the results (rewritten to gpu.json after every measurement), the
    progress bar over the planned measurements, and the current section's time box."""

    def __init__(self, args: argparse.Namespace, command: str):
        self.tiny = args.tiny
        self.device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
        self.json_path = args.out / "gpu.json"
        self.started = time.perf_counter()
        self.stop_at = float("inf")
        self.janus: JanusShape | None = None
        on_gpu = self.device.type == "cuda"
        self.results: dict = {
            "command": command,
            "environment": {
                "device": torch.cuda.get_device_name(self.device) if on_gpu else "cpu",
                "tiny": args.tiny,
                "reference_dtypes": list(DTYPES),
                "reference_batches": list(reference_batches(args.tiny)),
                "janus_dtype": "float32" if args.tiny else "bfloat16",
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "diffusers": diffusers.__version__,
                "python": platform.python_version(),
                "cpu_threads": torch.get_num_threads(),
                "deadline_seconds": args.deadline,
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
            },
            **{name: {"status": "not run"} for name in SECTIONS},
        }
        self.progress = tqdm(total=planned(args.sections, args.tiny), desc="ssd-bench gpu", unit="measurement")

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def janus_shape(self) -> JanusShape:
        if self.janus is None:
            self.check_time("building the Janus-Pro-7B shape")  # most of a minute at 7B
            self.janus = JanusShape(self.tiny, self.device)
        return self.janus

    def check_time(self, label: str) -> None:
        if time.perf_counter() > self.stop_at:
            raise OutOfTime(label)

    @contextmanager
    def measuring(self, label: str):
        """One planned measurement: refused once the section's time is up; counted and saved when it ends."""
        self.check_time(label)
        self.progress.set_postfix_str(label)
        yield
        self.progress.update()
        self.save()

    def save(self) -> None:
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.json_path.write_text(json.dumps(self.results, indent=1))

    def section(self, name: str, measure: Callable[[Run, dict], None], stop_at: float) -> None:
        """Run one section into results[name]: its status, seconds and (CUDA) peak memory, whatever happens."""
        self.stop_at = stop_at
        res = self.results[name] = {"status": "running"}
        if self.on_gpu:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        started = time.perf_counter()
        try:
            measure(self, res)
            res["status"] = "done"
        except OutOfTime as stopped:
            res["status"] = f"out of time before {stopped}"
        except Exception as exc:  # noqa: BLE001 - one section's failure must not cost the others
            res["status"] = f"error: {exc!r}"
            traceback.print_exc()
        res["seconds"] = round(time.perf_counter() - started, 1)
        if self.on_gpu:
            res["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 2)
            torch.cuda.empty_cache()
        self.save()


def planned(sections: str, tiny: bool) -> int:
    """The measurements the progress bar counts in these sections."""
    counts = {
        "A": 1 + len(DTYPES) * len(reference_batches(tiny)) * len(REFERENCE_DECODINGS),
        "B": 1 + len(VERTICAL_DRAFTERS) + len(MODES) * len(JANUS_DECODINGS),
        "C": 0,
        "E": len(JANUS_DECODINGS),
        "Q": 3,
    }
    return sum(counts[name] for name in sections)


def reference_batches(tiny: bool) -> tuple[int, int]:
    return (1, 2) if tiny else (1, 16)


def greedy_check(pipe: SSDAutoregressivePipeline, images: int = 2) -> dict:
    """Temperature 0: `exact`'s codes and uncapped `ssd`'s must be `ar`'s, exactly (the strategies are called
    directly, as the pipeline's verify_rounds=None means ssd's default cap)."""
    backbone = pipe.image_backbone
    sampling = SamplingConfig(temperature=0, guidance_scale=backbone.default_guidance_scale)
    batch = backbone.encode_prompts([PROMPT], None, images, guidance=sampling.uses_guidance)
    codes = {
        label: make_strategy(name, pipe.heads, **options).decode(backbone, batch, sampling).codes
        for label, (name, options) in GREEDY_DECODINGS.items()
    }
    return {
        "images": images,
        "exact_equals_ar": torch.equal(codes["exact"], codes["ar"]),
        "ssd_no_cap_equals_ar": torch.equal(codes["ssd, no cap"], codes["ar"]),
    }


def time_calls(pipe: SSDAutoregressivePipeline, images: int, options: dict, repeats: int, device) -> dict:
    """Median seconds of a pipeline call after a warm-up (same seed, so the same passes every call), per image
    and per pass; the codes only (`output_type="latent"`), so the VQ decoder is not timed."""
    passes = []

    def call() -> None:
        out = pipe(
            PROMPT,
            num_images_per_prompt=images,
            generator=torch.Generator().manual_seed(0),
            output_type="latent",
            **options,
        )
        passes.append(out.stats["forward_passes"])

    seconds = bs.median_seconds(call, device, repeats, warmup=1)
    return {"passes": passes[-1], "seconds_per_image": seconds / images, "ms_per_pass": 1e3 * seconds / passes[-1]}


def reference_section(run: Run, res: dict) -> None:
    """A: the shipped reference model on the device."""
    repeats = 1 if run.tiny else 2
    res["runs"] = []
    for dtype in DTYPES:
        pipe = SSDAutoregressivePipeline.from_pretrained(default_model(), dtype=getattr(torch, dtype)).to(run.device)
        pipe.set_progress_bar_config(disable=True)
        if dtype == "float32":  # bf16 rounding may flip near-ties between a 1-token pass and a row pass
            with run.measuring("A greedy check"):
                res["greedy_float32"] = greedy_check(pipe)
        for images in reference_batches(run.tiny):
            for label, options in REFERENCE_DECODINGS.items():
                with run.measuring(f"A {dtype} {label}, {images} image(s)"):
                    timed = time_calls(pipe, images, options, repeats, run.device)
                    res["runs"].append({"dtype": dtype, "decoding": label, "images": images, **timed})
        del pipe


def janus_section(run: Run, res: dict) -> None:
    """B: Janus-Pro-7B's shape: bare passes, the drafters' rows, the decodings end to end."""
    repeats = 3 if run.tiny else 10
    shape = run.janus_shape()
    backbone, grid = shape.backbone, shape.backbone.grid
    res.update(
        grid=[grid.rows, grid.cols],
        backbone_parameters=sum(p.numel() for p in backbone.model.parameters()),
        build_seconds=round(shape.build_seconds, 1),
    )
    with run.measuring("B bare passes"):
        bare = bs.measure(backbone, shape.heads["cell"], 1, bs.PROMPT_TOKENS, 2 * repeats)
        res["bare_passes"] = {**bare, "pass_bytes": shape.pass_bytes()}
    res["drafters"] = {}
    try:
        for kind in VERTICAL_DRAFTERS:
            with run.measuring(f"B {kind} drafter row"):
                seconds = shape.draft_row_seconds(kind, repeats)
                shape.backbone.compile_passes(mode_options("compiled", run.tiny))  # the row as one compiled step
                compiled = shape.draft_row_seconds(kind, repeats)  # its warm-up compiles
                shape.backbone.compile_passes(None)
                parameters = sum(p.numel() for p in shape.heads_of(kind).vertical[0].parameters())  # offset 1's
                res["drafters"][kind] = {
                    "parameters": parameters,
                    "seconds_per_row": seconds,
                    "seconds_per_row_compiled": compiled,
                }
        res["decodings"] = []
        for mode in MODES:
            options = mode_options(mode, run.tiny)
            shape.backbone.compile_passes(options)
            skips = cudagraph_skips()
            for label in JANUS_DECODINGS:
                with run.measuring(f"B {label} ({mode})"):
                    if options is not None:
                        shape.decode(label)  # compiles: not timed
                    passes, seconds = shape.timed_decode(label)
                    bare_pass = "ar_step" if label == "ar" else "row_pass"
                    res["decodings"].append(
                        {
                            "mode": mode,
                            "decoding": label,
                            "passes": passes,
                            "seconds": seconds,
                            "ms_per_pass": 1e3 * seconds / passes,
                            "bare_pass": bare_pass,
                            "per_bare_pass": seconds / passes / bare[bare_pass],
                        }
                    )
            if mode == "captured":
                res["cudagraph_skips"] = cudagraph_skips() - skips
    finally:
        shape.backbone.compile_passes(None)  # E counts the eager passes' syncs


def projection_section(run: Run, res: dict) -> None:
    """C: AR = prefill + cells x the 1-token pass, against SSD = prefill + N x (row pass + cell heads), N from
    the paper and from the reference model's measured pass ratios (fp32, one image)."""
    janus = run.results["B"]
    if "bare_passes" not in janus:
        raise ValueError("section B's bare passes were not measured: run section B with C")
    grid, seconds = janus["grid"], janus["bare_passes"]
    cells = grid[0] * grid[1]
    bases = [("paper", label, n) for label, n in zip(("ssd r=1", "ssd r=2"), bs.paper_passes(grid))]
    runs = {r["decoding"]: r for r in run.results["A"].get("runs", []) if r["dtype"] == "float32" and r["images"] == 1}
    if "ar" in runs:
        for label in ("ssd r=2", "exact"):
            if label in runs:
                bases.append(("reference model", label, round(runs[label]["passes"] / runs["ar"]["passes"] * cells)))
    res["projections"] = []
    for source, label, n in bases:
        projected = bs.project(seconds, cells, (n,))
        res["projections"].append(
            {
                "source": source,
                "decoding": label,
                "ssd_passes": n,
                "ar_seconds": projected["ar_seconds"],
                "ssd_seconds": projected[f"ssd_{n}_seconds"],
                "speedup": projected[f"ssd_{n}_speedup"],
            }
        )


def sync_site(stack: list[traceback.FrameSummary], message: str) -> str:
    """Where a host sync happened: the innermost frame of ssd_pipelines outside its testing surface (whose counters
    wrap torch's calls), as file:line; the warning's message where the stack has none."""
    for frame in reversed(stack):
        path = Path(frame.filename)
        if PACKAGE in path.parents and path.parent != PACKAGE / "testing":
            return f"{path.relative_to(PACKAGE.parent).as_posix()}:{frame.lineno}"  # as `host_syncs` names sites
    return message


@contextmanager
def warning_sites(pattern: str):
    """The sites (`sync_site`) of every warning whose message holds `pattern` while open; others pass through."""
    sites: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        show = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if pattern in str(message):
                sites.append(sync_site(traceback.extract_stack()[:-1], str(message)))
            else:
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        yield sites


@contextmanager
def sync_warnings(device: torch.device):
    """On CUDA, the sites of the host syncs torch's sync debug mode warns of while open; None elsewhere."""
    if device.type != "cuda":
        yield None
        return
    with warning_sites("synchronizing") as sites:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode("default")


def host_sync_section(run: Run, res: dict) -> None:
    """E: B's decodes once more, counting host syncs (and on CUDA catching torch's sync warnings)."""
    from ssd_pipelines.testing.host_syncs import count_host_syncs

    shape = run.janus_shape()
    res["decodings"] = {}
    for label in JANUS_DECODINGS:
        with run.measuring(f"E {label}"):
            with sync_warnings(run.device) as sites, count_host_syncs() as syncs:
                passes = shape.decode(label).stats.forward_passes
            res["decodings"][label] = {
                "passes": passes,
                "host_syncs": syncs.total,
                "per_pass": syncs.per(passes),
                "kinds": dict(syncs.counts),
                "summary": syncs.summary(),
                "sync_warnings": None if sites is None else len(sites),
                "top_sites": None if sites is None else Counter(sites).most_common(5),
            }


MEASURES = {
    "A": reference_section,
    "B": janus_section,
    "C": projection_section,
    "E": host_sync_section,
    "Q": quantized_section,
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = commands.gpu_parser()
    args = parser.parse_args(argv)  # --sections: letters of commands.GPU_SECTIONS, the keys of SHARES
    if args.tiny:
        torch.set_num_threads(args.threads)
    sections = "".join(name for name in SHARES if name in args.sections)  # in order: C reads A and B
    run = Run(args, shlex.join(["ssd-bench", "gpu", *argv]))
    share, total = 0.0, sum(SHARES[name] for name in sections) or 1.0
    for name in sections:
        share += SHARES[name]
        run.section(name, MEASURES[name], run.started + args.deadline * share / total)
    run.progress.close()
    peaks = {name: run.results[name].get("peak_memory_gib") for name in SHARES}
    run.results["D"] = {"status": "done", "peak_memory_gib": peaks}
    run.results["F"] = {"status": "done", "rows": targets(run.results, run.on_gpu)}
    run.save()
    report(markdown(run.results, run.on_gpu), args.out / "gpu.md", TITLE, run.results["command"])


if __name__ == "__main__":
    main()
