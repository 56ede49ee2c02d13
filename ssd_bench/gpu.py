"""The GPU measurement of issues 39 and 51 in one command: what the decodings cost on a GPU, and how far from the
targets, within some 9 minutes of a GPU lease.

Sections (gpu.json and gpu.md are rewritten after every measurement, so a run cut short keeps what it measured):

  A  the shipped reference model on the device, fp32 and bf16: seconds per image, passes and seconds per pass of
     ar, exact, ssd r=1 and r=2 for 1 and 16 images, and the greedy check (exact and uncapped ssd == ar);
  B  Janus-Pro-7B's shape with random bf16 weights, one time box per mode: `captured` first, the mode that matters on
     a GPU (passes and steps through torch.compile with static shapes, replayed as CUDA graphs:
     mode="reduce-overhead"), then `eager`, the reference, then `compiled` (dynamic shapes, no graphs), last, so that
     a compile of it that runs out of time runs beside no timing. Each mode times the bare passes (1 token, one row),
     its decodings cut after ROWS rows by their row callback, per pass (seconds / forward passes, both from
     out.stats) and in GB/s (weight bytes x passes a second), and the drafters' rows; and records what torch did:
     the calls' compiled and eager counts, graphs and warnings (out.stats, out.warnings), and dynamo's counters
     (graphs, graph breaks, inductor's CUDA-graph skips and cache hits). A pass's ratio is to the captured bare
     pass of its width;
  C  projections: AR against SSD at the paper's pass counts and at the reference model's measured pass ratios, from
     the captured bare passes;
  E  host syncs of B's decodings over SYNC_ROWS rows, counted inside each mode's box while its graphs are warm (a
     mode enabled again would compile again): by `host_syncs` on the thread the passes run on, with the compiled
     functions run eagerly (dynamo does not trace under the counter's dispatch mode), so the code between graphs is
     the compiled path's own; and on CUDA by torch's sync debug mode over the compiled path itself;
  Q  (only when asked: --sections Q) the 7B shape in int8 and nf4 beside bf16 (`gpu_quantized.py`).

D (peak memory per section, CUDA only) and F (issue 39's targets) follow from what ran.

Time boxes. Each box's work runs in a worker thread, and the main thread waits for its reports until the box's end.
Then it stops waiting: the measurement in progress (a compile included) is reported abandoned in gpu.json and
gpu.md, the rest of the box is skipped, and the next box starts. A compile cannot be interrupted from Python, so the
worker is only told to stop: its decodes' row callback and each measurement check that, and it stops at the first
check it reaches; whatever it measures after its box has ended is dropped (the main thread alone writes the
results). Until then it runs beside what follows: each box names the abandoned work still running when it started
(`beside_abandoned`), and the process waits for an abandoned compile to end before it exits. Each box has its
planned seconds, scaled so that all of them and the reserve fill --deadline; a box that ends early ends the run
early, so that no box depends on the speed of those before it.

The default run, planned for one H200 (540 s; a captured compile of the 7B pass takes some 30-60 s a width, the
eager 7B pass some 40 ms, 75 ms a pass inside a decode, and counting host syncs doubles that):

  box          s   what
  A           70   the reference model: 16 settings, each a warm-up and 2 timed calls of 0.1-3 s; the greedy check
  B build     40   the 7B shape, random bf16 weights (13.3 GB)
  B captured 225   compiles: the pass at widths 1 and 24 (bare passes, ar, exact) and 6 (ssd's first row), and the
                   engines' steps; ar, ssd r=2 and exact (per-cell drafter) and ssd r=2 (recurrent), each a warm-up
                   decode of 3 rows that compiles, then the same 3 rows timed; host syncs over 2 rows (~20 s); the
                   per-cell and recurrent drafters' rows
  B eager     75   all five decodings, 3 rows each, once (the bare passes warm the model; ~25 s); their host syncs,
                   counted and, on CUDA, warned of (~40 s); the four drafters' rows
  B compiled  90   a dynamic compile of the pass (widths 1 and more) and of the steps; ar, ssd r=2 and exact
                   (per-cell), as captured
  reserve     40   the report, and the end of an abandoned compile, which the process waits for

C, D, E and F take no time of their own. Q asked alone (--sections Q) gets the deadline less the reserve.

    ssd-bench gpu                 # on a GPU, about 9 minutes -> docs/gpu.md and docs/gpu.json
    ssd-bench gpu --sections Q --out docs/gpu_quantized   # the quantized 7B shape, about 4 minutes
    ssd-bench gpu --tiny          # the same code paths on the CPU (a tiny Janus, fewer repeats), 1-2 minutes
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import queue
import shlex
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
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
from ssd_pipelines.testing.host_syncs import count_host_syncs

from . import backbone_speed as bs
from . import commands, report
from .gpu_quantized import quantized_section
from .gpu_report import SECTIONS, TITLE, first_measured, markdown, per_bare_pass, targets

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
# How B's decodings run (`compile_passes`' options): static passes and steps replayed as CUDA graphs (inductor skips
# the graphs that write tensors it does not hold at fixed addresses, and counts its skips); eagerly; the passes and
# the steps between them through torch.compile with dynamic shapes
MODES = {"captured": {"mode": "reduce-overhead", "dynamic": False}, "eager": None, "compiled": {"dynamic": True}}
ROWS = 3  # rows of each timed 7B decode (the row callback stops it there); --tiny: TINY_ROWS of its 4
TINY_ROWS = 2
SYNC_ROWS = 2  # rows of each decode whose host syncs E counts
TINY_BACKEND = "eager"  # what --tiny compiles with: the path in seconds, where inductor takes tens a graph on a CPU


@dataclass(frozen=True)
class ModePlan:
    """What one mode's box measures, in this order after its bare passes, and its box at the default deadline."""

    decodings: tuple[str, ...]
    drafters: tuple[str, ...]
    seconds: float


PLAN = {  # in the order B runs them (the module's docstring)
    "captured": ModePlan(("ar", "ssd r=2, cell", "exact, cell", "ssd r=2, recurrent"), ("cell", "recurrent"), 225),
    "eager": ModePlan(tuple(JANUS_DECODINGS), VERTICAL_DRAFTERS, 75),
    "compiled": ModePlan(("ar", "ssd r=2, cell", "exact, cell"), (), 90),
}
# seconds of the other boxes at the default deadline, and what the report and an abandoned compile keep after them
BOXES = {"A": 70, "B build": 40, "Q": 240}
RESERVE = 40
PACKAGE = Path(ssd_pipelines.__file__).resolve().parent


def mode_options(mode: str, tiny: bool) -> dict | None:
    """MODES[mode]; with --tiny compiled by TINY_BACKEND (no CUDA graphs on a CPU), static shapes kept."""
    options = MODES[mode]
    if options is None or not tiny:
        return options
    return {"dynamic": options["dynamic"], "backend": TINY_BACKEND}


def box_seconds(sections: str) -> dict[str, float]:
    """Each box these sections run -> its planned seconds at the default deadline, in the order they run."""
    boxes = {"A": BOXES["A"]} if "A" in sections else {}
    if "B" in sections:
        boxes["B build"] = BOXES["B build"]
        boxes.update({f"B {mode}": plan.seconds for mode, plan in PLAN.items()})
    if "Q" in sections:
        boxes["Q"] = BOXES["Q"]
    return boxes


def box_lengths(boxes: dict[str, float], deadline: float) -> dict[str, float]:
    """Each box's seconds: its planned ones, scaled so that all of them and the reserve fill the deadline."""
    scale = deadline / (sum(boxes.values()) + RESERVE)
    return {label: seconds * scale for label, seconds in boxes.items()}


def torch_counters() -> dict[str, dict[str, int]]:
    """dynamo's and inductor's counters this process has counted so far, those that say what compiled and what not:
    graphs and the calls they captured, graph breaks by reason, aot_autograd's outcomes, inductor's CUDA-graph skips
    and FX graph cache hits and misses."""
    counters = torch._dynamo.utils.counters
    kept = {group: dict(counters[group]) for group in ("stats", "graph_break", "aot_autograd")}
    inductor = ("cudagraph_skips", "fxgraph_cache_hit", "fxgraph_cache_miss")
    kept["inductor"] = {key: counters["inductor"][key] for key in inductor if counters["inductor"][key]}
    return kept


def counted_since(before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """What the counters counted since `before` (global to the process: an abandoned compile beside adds its own)."""
    since = {group: {k: n - before[group].get(k, 0) for k, n in now.items()} for group, now in torch_counters().items()}
    return {group: {k: n for k, n in counts.items() if n} for group, counts in since.items()}


def calls(out) -> dict:
    """What a decode's compiled functions did: calls run compiled and eagerly, graphs compiled, and why (warnings)."""
    s = out.stats
    return {
        "compiled_calls": s.compiled_calls,
        "eager_calls": s.eager_calls,
        "graphs_compiled": s.graphs_compiled,
        "warnings": list(out.warnings),
    }


class Abandoned(Exception):
    """The box this work runs in has ended: the work stops here, and nothing it measures from now on is kept."""


class Box:
    """One time box, shared by the main thread, which waits, and the worker that runs its work.

    The worker reports through `reports`: ("measuring", label) as a measurement starts, ("measured", a JSON copy of
    `res`) as it ends, and at the end ("done", what the work returned) or ("error", status). The main thread writes
    the results from these alone, so nothing the worker does once the box has ended reaches them."""

    def __init__(self) -> None:
        self.res: dict = {}  # the worker's own
        self.stop = threading.Event()  # set by the main thread when the box ends
        self.reports: queue.SimpleQueue = queue.SimpleQueue()

    def check(self, label: str) -> None:
        if self.stop.is_set():
            raise Abandoned(label)

    @contextmanager
    def measuring(self, label: str):
        """One measurement: refused once the box has ended; its figures (what it put in `res`) reported when it ends
        in time."""
        self.check(label)
        self.reports.put(("measuring", label))
        yield
        self.check(label)
        self.reports.put(("measured", json.loads(json.dumps(self.res))))

    def rows(self, rows: int) -> Callable[[int, torch.Tensor], bool]:
        """A decode's row callback: stop after `rows` rows, or at the next row once the box has ended."""
        return lambda row, codes: row + 1 >= rows or self.stop.is_set()


def on_runner(backbone, work: Callable):
    """work(None) where the backbone's compiled calls run (its owner thread; the caller's when eager): CUDA graphs
    are recorded, and host syncs counted, per thread, so bare passes and counted decodes run where decodes do."""
    return backbone.runner.run(work, None)


class JanusShape:
    """Janus-Pro-7B's shape with random weights, built once for section B: the backbone, heads of each drafter kind
    (made when first asked for), and a one-image prompt batch with Janus's guidance."""

    def __init__(self, tiny: bool, device: torch.device):
        started = time.perf_counter()
        self.backbone, cell = bs.build(bs.janus_pro_config(tiny), device, torch.float32 if tiny else torch.bfloat16)
        self.build_seconds = time.perf_counter() - started
        self.heads = {"cell": cell}
        ids = torch.randint(3, 100, (2, bs.PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
        pad, grid = self.backbone.pad_token_id, self.backbone.grid
        self.batch = left_padded_batch(ids[:1].tolist(), ids[1:].tolist(), 1, pad, grid)
        self.sampling = SamplingConfig(guidance_scale=self.backbone.default_guidance_scale)
        self.pass_bytes = self.weight_bytes()

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

    def decode(self, label: str, callback):
        """One image decoded by JANUS_DECODINGS[label], the same seed every time (so the same passes)."""
        name, kind, options = JANUS_DECODINGS[label]
        strategy = make_strategy(name, None if kind is None else self.heads_of(kind), **options)
        generator = torch.Generator().manual_seed(1)
        return strategy.decode(self.backbone, self.batch, self.sampling, generator, callback=callback)

    def timed_decode(self, mode: str, label: str, rows: int, box: Box) -> dict:
        """A decode cut after `rows` rows, per pass from its stats; where compiled, after a warm-up decode of the same
        rows and seed, which compiles (and on CUDA records the graphs the timed one replays). Eager decodes are timed
        once: the bare passes warmed the model."""
        warmup = None if MODES[mode] is None else self.decode(label, box.rows(rows))
        out = self.decode(label, box.rows(rows))
        s = out.stats
        record = {
            "mode": mode,
            "decoding": label,
            "rows": s.rows_completed,
            "passes": s.forward_passes,
            "seconds": s.seconds,
            "seconds_per_pass": s.seconds / s.forward_passes,
            "gb_per_s": self.pass_bytes * s.forward_passes / s.seconds / 1e9,
            **calls(out),
        }
        if warmup is not None:
            record["warmup"] = {"seconds": warmup.stats.seconds, **calls(warmup)}
        return record

    def bare_passes(self, repeats: int) -> dict:
        """`backbone_speed.measure`'s passes where decodes run them (the cache filled a row a pass: the row pass's
        graph), and the bandwidth they achieve (weight bytes a second, as gpt-fast prints it)."""
        b = self.backbone
        measure = functools.partial(bs.measure, b, self.heads["cell"], 1, bs.PROMPT_TOKENS, repeats, fill=b.grid.cols)
        seconds = on_runner(b, lambda _: measure())
        bandwidth = {f"{key}_gb_per_s": self.pass_bytes / seconds[key] / 1e9 for key in ("ar_step", "row_pass")}
        return {**seconds, **bandwidth}

    def draft_row(self, kind: str, repeats: int) -> dict:
        """Seconds block `ssd` takes to draft the second row and sample its codes (`ssd_row_draft`: the drafter, the
        backbone's output head, sampling; an in-row drafter left to right), as a step of the mode it runs in, made
        and timed where decodes run it (inference mode is the thread's own)."""
        heads = self.heads_of(kind)

        def timed(_) -> float:
            with torch.inference_mode():
                draft = ssd_row_draft(heads, self.backbone, self.batch, self.sampling)
                return bs.median_seconds(draft, self.backbone.device, repeats)

        parameters = sum(p.numel() for p in heads.vertical[0].parameters())  # offset 1's
        return {"parameters": parameters, "seconds_per_row": on_runner(self.backbone, timed)}

    def host_syncs(self, label: str, rows: int, box: Box) -> dict:
        """Host syncs of a decode of `rows` rows on the path it takes now, counted on the thread its passes run on;
        compiled functions run eagerly there (`force_eager`): dynamo does not trace under the counter's dispatch
        mode, and a graph holds no sync (fullgraph=True breaks on one). On CUDA, the same decode once more under
        torch's sync debug mode, compiled."""

        def counted(_):
            with torch.compiler.set_stance("force_eager"), count_host_syncs() as syncs:
                return self.decode(label, box.rows(rows)).stats.forward_passes, syncs

        passes, syncs = on_runner(self.backbone, counted)
        record = {
            "passes": passes,
            "host_syncs": syncs.total,
            "per_pass": syncs.per(passes),
            "kinds": dict(syncs.counts),
            "summary": syncs.summary(),
            "sync_warnings": None,
            "top_sites": None,
        }
        if self.backbone.device.type == "cuda":
            with sync_warnings(self.backbone.device) as sites:
                self.decode(label, box.rows(rows))
            record.update(sync_warnings=len(sites), top_sites=Counter(sites).most_common(5))
        return record

    def weight_bytes(self) -> int:
        """Bytes of the weights a 1-token pass reads: the language model's layers and the image generation head
        (token embeddings are gathered, not read whole)."""
        model = self.backbone.model.model
        parts = (model.language_model.layers, model.language_model.norm, model.generation_head)
        return sum(p.numel() * p.element_size() for part in parts for p in part.parameters())


class Run:
    """One `ssd-bench gpu` run: the device, the results (gpu.json and gpu.md rewritten after every measurement),
    the progress bar over the planned measurements, and the time boxes."""

    def __init__(self, args: argparse.Namespace, command: str, sections: str):
        self.tiny = args.tiny
        self.sections = sections
        self.device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
        self.out = args.out
        self.lengths = box_lengths(box_seconds(sections), args.deadline)
        self.abandoned: list[tuple[str, threading.Thread]] = []  # boxes whose worker may still run
        self.local = threading.local()  # a worker's box, for `measuring`
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
        self.progress = tqdm(total=planned(sections, args.tiny), desc="ssd-bench gpu", unit="measurement")

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def measuring(self, label: str):
        """One measurement of the box this thread works in (the worker's: see `Box.measuring`)."""
        return self.local.box.measuring(label)

    def save(self) -> None:
        """gpu.json and gpu.md as they stand (the targets and D once every section has run)."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu.json").write_text(json.dumps(self.results, indent=1))
        (self.out / "gpu.md").write_text(self.document())

    def document(self) -> str:
        """gpu.md: as `ssd_bench.report` writes it, title and command first."""
        body = "\n".join(markdown(self.results, self.on_gpu))
        return f"# {TITLE}\n\nMade by `{self.results['command']}`.\n\n{body}\n"

    def boxed(self, label: str, work: Callable[[Box], object], place: Callable[[dict], None]) -> tuple[dict, object]:
        """work(box) in a worker thread for at most the box's seconds; each snapshot of box.res it reports goes to
        place() and is saved. Returns the box's record (its status, the seconds it had and took, the abandoned boxes
        still running when it began) and what work returned (None unless done)."""
        box, length = Box(), self.lengths[label]
        record = {"allowed_seconds": round(length, 1), "beside_abandoned": self.still_running()}
        thread = threading.Thread(target=self.work_in, args=(box, work), name=f"ssd-bench {label}", daemon=True)
        started = time.perf_counter()
        thread.start()
        status, value, current = None, None, label
        while status is None:
            try:
                kind, said = box.reports.get(timeout=max(0.0, started + length - time.perf_counter()))
            except queue.Empty:
                box.stop.set()
                self.abandoned.append((label, thread))
                status = f"abandoned at the end of its {length:.1f} s, in {current}"
            else:
                if kind == "measuring":
                    current = said
                    self.progress.set_postfix_str(said)
                elif kind == "measured":
                    place(said)
                    self.progress.update()
                    self.save()
                else:
                    status, value = ("done", said) if kind == "done" else (said, None)
        record.update(status=status, seconds=round(time.perf_counter() - started, 1))
        return record, value

    def work_in(self, box: Box, work: Callable[[Box], object]) -> None:
        """The worker: work(box), its end reported; silent once the box has ended (no one reads it then)."""
        self.local.box = box
        try:
            value = work(box)
        except Abandoned:
            return
        except Exception as exc:  # noqa: BLE001 - reported as the box's status
            if not box.stop.is_set():
                traceback.print_exc()
                box.reports.put(("error", f"error: {exc!r}"))
            return
        box.reports.put(("done", value))

    def still_running(self) -> list[str]:
        return [label for label, thread in self.abandoned if thread.is_alive()]

    def section(self, name: str, measure: Callable[[Run, dict], None]) -> None:
        """Run one section into results[name]: its status, seconds and (CUDA) peak memory, whatever happens."""
        res = self.results[name] = {"status": "running"}
        if self.on_gpu:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        started = time.perf_counter()
        try:
            measure(self, res)
            res["status"] = res.pop("ended", "done")
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
    modes = sum(1 + len(p.decodings) * (1 + ("E" in sections)) + len(p.drafters) for p in PLAN.values())
    counts = {"A": 1 + len(DTYPES) * len(reference_batches(tiny)) * len(REFERENCE_DECODINGS), "B": 1 + modes, "Q": 3}
    return sum(counts.get(name, 0) for name in sections)


def reference_batches(tiny: bool) -> tuple[int, int]:
    return (1, 2) if tiny else (1, 16)


def in_a_box(name: str, measure: Callable[[Run, dict], None]) -> Callable[[Run, dict], None]:
    """A section measured in one time box of its own (`Run.boxed`): its status is the box's."""

    def boxed(run: Run, res: dict) -> None:
        record, _ = run.boxed(name, lambda box: measure(run, box.res), res.update)
        res["ended"] = record["status"]
        res["box"] = record

    return boxed


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


def build_shape(run: Run, box: Box) -> JanusShape:
    """B's first box: the 7B shape (most of a minute at 7B)."""
    with box.measuring("B building the Janus-Pro-7B shape"):
        shape = JanusShape(run.tiny, run.device)
        grid = shape.backbone.grid
        box.res.update(
            grid=[grid.rows, grid.cols],
            backbone_parameters=sum(p.numel() for p in shape.backbone.model.parameters()),
            build_seconds=round(shape.build_seconds, 1),
            pass_bytes=shape.pass_bytes,
        )
    return shape


def measure_mode(run: Run, shape: JanusShape, mode: str, box: Box) -> None:
    """One mode's box: its bare passes, its decodings cut after a few rows, their host syncs (with E), its drafters'
    rows; after each, what torch compiled since the box began."""
    plan, res = PLAN[mode], box.res
    repeats, rows = (3, TINY_ROWS) if run.tiny else (10, ROWS)
    res.update(options=mode_options(mode, run.tiny), decodings=[], drafters={})
    before = torch_counters()
    shape.backbone.compile_passes(res["options"])

    @contextmanager
    def measuring(label: str):
        with box.measuring(label):
            yield
            res["torch"] = counted_since(before)

    with measuring(f"B {mode} bare passes"):
        res["bare_passes"] = shape.bare_passes(2 * repeats)
    for label in plan.decodings:
        with measuring(f"B {mode} {label}"):
            res["decodings"].append(shape.timed_decode(mode, label, rows, box))
    if "E" in run.sections:
        res["host_syncs"] = {}
        for label in plan.decodings:
            with measuring(f"E {mode} {label}"):
                res["host_syncs"][label] = shape.host_syncs(label, SYNC_ROWS, box)
    for kind in plan.drafters:
        with measuring(f"B {mode} {kind} drafter row"):
            res["drafters"][kind] = shape.draft_row(kind, repeats)


def janus_section(run: Run, res: dict) -> None:
    """B: the 7B shape built in a box of its own, then a box per mode, captured first; each mode's figures placed
    as they come, with every decoding's ratio to the bare pass of its width."""
    res.update(rows=TINY_ROWS if run.tiny else ROWS, boxes={}, modes={})
    res["boxes"]["build"], shape = run.boxed("B build", lambda box: build_shape(run, box), res.update)
    run.janus = shape
    try:
        for mode in PLAN:
            if shape is None:
                res["boxes"][mode] = {"status": "not run: the 7B shape was not built"}
                continue

            def place(snapshot: dict, mode: str = mode) -> None:
                res["modes"][mode] = snapshot
                for decoding in (d for m in res["modes"].values() for d in m["decodings"]):
                    decoding["per_bare_pass"] = per_bare_pass(decoding, res["modes"])

            res["boxes"][mode], _ = run.boxed(f"B {mode}", functools.partial(measure_mode, run, shape, mode), place)
    finally:
        if shape is not None:
            shape.backbone.compile_passes(None)  # Q, and anything after, runs eagerly
    unfinished = [f"{label}: {box['status']}" for label, box in res["boxes"].items() if box["status"] != "done"]
    if unfinished:
        res["ended"] = "; ".join(unfinished)


def projection_section(run: Run, res: dict) -> None:
    """C: AR = prefill + cells x the 1-token pass, against SSD = prefill + N x (row pass + cell heads), N from
    the paper and from the reference model's measured pass ratios (fp32, one image); the bare passes of the first
    mode that measured them, captured first (`first_measured`)."""
    janus = run.results["B"]
    mode, seconds = first_measured(janus.get("modes", {}), "bare_passes")
    if mode is None:
        raise ValueError("section B's bare passes were not measured: run section B with C")
    res["bare_passes_of"], grid = mode, janus["grid"]
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
    """On CUDA, the sites of the host syncs torch's sync debug mode warns of while open (in any thread: the compiled
    calls run on their owner's)."""
    with warning_sites("synchronizing") as sites:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode("default")


def host_sync_section(run: Run, res: dict) -> None:
    """E: the host syncs B's boxes counted, mode by mode, moved here from B's results."""
    counted = {mode: m.pop("host_syncs") for mode, m in run.results["B"].get("modes", {}).items() if "host_syncs" in m}
    if not counted:
        raise ValueError("section B counts the host syncs, inside its boxes: run section B with E")
    res["rows"] = SYNC_ROWS
    res["modes"] = counted


MEASURES = {
    "A": in_a_box("A", reference_section),
    "B": janus_section,
    "C": projection_section,
    "E": host_sync_section,
    "Q": in_a_box("Q", quantized_section),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = commands.gpu_parser().parse_args(argv)  # --sections: letters of commands.GPU_SECTIONS, MEASURES' keys
    if args.tiny:
        torch.set_num_threads(args.threads)
    sections = "".join(name for name in MEASURES if name in args.sections)  # in order: C and E read A and B
    run = Run(args, shlex.join(["ssd-bench", "gpu", *argv]), sections)
    for name in sections:
        run.section(name, MEASURES[name])
    run.progress.close()
    peaks = {name: run.results[name].get("peak_memory_gib") for name in MEASURES}
    run.results["D"] = {"status": "done", "peak_memory_gib": peaks}
    run.results["F"] = {"status": "done", "rows": targets(run.results, run.on_gpu)}
    run.save()
    report(markdown(run.results, run.on_gpu), args.out / "gpu.md", TITLE, run.results["command"])


if __name__ == "__main__":
    main()
