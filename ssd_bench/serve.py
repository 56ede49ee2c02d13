"""Serving under load: throughput and latency of `ar`, `exact` and `auto` on a local Ray Serve app, 1 and 2 replicas.

The benchmark starts a local Ray (or uses the one this process is connected to), runs the `ssd-serve` application
(`serving.deployment.build_app`) on 127.0.0.1 with each replica count in turn, and sends it load: at each level,
`clients` threads send requests back to back over HTTP (one image each, `response="png"`, distinct seeds, prompts
from held-out reference captions) until the level's `--requests` are answered. The three decodings are run one
after another at each level, so that a change in the machine's load hits them alike. Each replica count starts with
untimed requests of each decoding. Throughput is images answered over the level's wall time; latency is a request's
round trip, queueing in the replica's batch included. Every wait has a deadline.

    ssd-bench serve                      # about 15 minutes on 2 CPU cores -> docs/serving_benchmark.md and its figure
    ssd-bench serve --clients 1 4 --requests 8 --replicas 1
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import socket
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from . import commands, report
from .commands import CLIENTS, REPLICAS, SERVE_DECODINGS

APP_NAME = "ssd-bench-serve"
STARTUP_S = 600  # serve.run, crossover measurement included
TARGET_AUTO = 0.9  # auto's throughput within 10 % of the better of ar and exact
TARGET_LATENCY = 1.3  # p50 latency at 1 client, ar's over auto's


@dataclass
class Level:
    """One load level of one decoding on one replica count: what every request took and what it ran in."""

    replicas: int
    decoding: str
    clients: int
    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, answered requests
    call_images: list[int] = field(default_factory=list)  # images of the pipeline call each one ran in
    chosen: list[str] = field(default_factory=list)  # the decoding that ran (auto: exact or ar)
    exact_max_batch: set[int] = field(default_factory=set)  # the servers' crossovers seen in the answers
    errors: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(level: Level) -> dict:
    """The table row of a level."""
    answered = len(level.latencies)
    exact_share = level.chosen.count("exact") / len(level.chosen) if level.chosen else float("nan")
    return {
        "replicas": level.replicas,
        "decoding": level.decoding,
        "clients": level.clients,
        "requests": answered + len(level.errors),
        "errors": len(level.errors),
        "throughput": answered / level.wall_s if level.wall_s > 0 else float("nan"),
        "p50": percentile(level.latencies, 50),
        "p95": percentile(level.latencies, 95),
        "call_images": statistics.mean(level.call_images) if level.call_images else float("nan"),
        "exact_share": exact_share,
        "exact_max_batch": sorted(level.exact_max_batch),
    }


# --- load ------------------------------------------------------------------------------------------------------


def post(url: str, body: dict, timeout: float) -> tuple[float, dict]:
    """One request: (seconds, the stats of its answer); an HTTP error or a timeout raises."""
    request = urllib.request.Request(
        url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()
        stats = json.loads(response.headers.get("X-SSD-Stats", "{}"))
    return time.perf_counter() - started, stats


def run_level(
    url: str,
    level: Level,
    requests: int,
    prompts: list[str],
    seed: int,
    timeout: float,
    on_answer: Callable[[], None] | None = None,
) -> Level:
    """`level.clients` clients sending `requests` requests in all (at least one each), back to back."""
    per_client = [requests // level.clients + (i < requests % level.clients) for i in range(level.clients)]
    per_client = [max(1, n) for n in per_client]
    starts = [sum(per_client[:i]) for i in range(level.clients)]

    def client(index: int) -> None:
        for k in range(per_client[index]):
            n = starts[index] + k
            body = {"prompt": prompts[n % len(prompts)], "seed": seed + n, "decoding": level.decoding}
            try:
                seconds, stats = post(url, body | {"response": "png"}, timeout)
            except (urllib.error.URLError, TimeoutError, OSError) as error:
                level.errors.append(f"{type(error).__name__}: {error}")
            else:
                level.latencies.append(seconds)
                serving = stats.get("serving", {})
                level.call_images.append(serving.get("call_images", 0))
                level.chosen.append(stats.get("chosen_decoding") or stats.get("strategy", level.decoding))
                if "exact_max_batch" in serving:
                    level.exact_max_batch.add(serving["exact_max_batch"])
            if on_answer:
                on_answer()

    started = time.perf_counter()
    with ThreadPoolExecutor(level.clients) as pool:
        for future in [pool.submit(client, i) for i in range(level.clients)]:
            future.result(timeout=timeout * max(per_client) + 60)
    level.wall_s = time.perf_counter() - started
    return level


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def local_serve(
    model: str | None, replicas: int, threads: int, exact_max_batch, max_batch_size: int, batch_wait_timeout_s: float
) -> Iterator[tuple[str, dict]]:
    """The application on 127.0.0.1 with `replicas` replicas: (its URL, its GET /info); Serve shut down after.
    Starts a local Ray with this machine's CPUs unless this process is connected to one (then it stays)."""
    import ray
    from ray import serve

    from ssd_pipelines.serving.deployment import build_app

    owned = not ray.is_initialized()
    if owned:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(
            model,
            num_replicas=replicas,
            ray_actor_options={"num_cpus": threads},
            max_batch_size=max_batch_size,
            batch_wait_timeout_s=batch_wait_timeout_s,
            threads=threads,
            exact_max_batch=exact_max_batch,
        )
        with ThreadPoolExecutor(1) as pool:  # serve.run with a deadline
            pool.submit(serve.run, app, name=APP_NAME, route_prefix="/").result(timeout=STARTUP_S)
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(url + "/info", timeout=60) as response:
            info = json.load(response)
        yield url, info
    finally:
        serve.shutdown()
        if owned:
            ray.shutdown()


def run(
    model: str | None = None,
    replicas=REPLICAS,
    clients=CLIENTS,
    decodings=SERVE_DECODINGS,
    requests: int = 16,
    threads: int = 1,
    exact_max_batch="measure",
    max_batch_size: int = 8,
    batch_wait_timeout_s: float = 0.05,
    timeout: float = 120,
    progress: bool = True,
) -> tuple[list[dict], dict]:
    """Every level: (the table's rows, per replica count the servers' info: `exact_max_batch` and crossover)."""
    from ssd_pipelines.serving.crossover import captions

    prompts = captions(64)
    per_level = [max(requests, c) for c in clients]
    total = len(replicas) * len(decodings) * (sum(per_level) + 2 * max(replicas))
    rows, servers = [], {}
    seed = 0
    with tqdm(total=total, desc="serve", unit="request", disable=not progress) as bar:
        for count in replicas:
            bar.set_postfix_str(f"starting {count} replica(s)")
            with local_serve(model, count, threads, exact_max_batch, max_batch_size, batch_wait_timeout_s) as (
                url,
                info,
            ):
                seen: set[int] = set()
                for decoding in decodings:  # untimed: each replica runs each decoding once
                    bar.set_postfix_str(f"{count} replica(s), warm-up {decoding}")
                    warm = run_level(url, Level(count, decoding, 2 * count), 2 * count, prompts, 10**6, timeout)
                    bar.update(2 * max(replicas))
                    seen |= warm.exact_max_batch
                servers[count] = {"exact_max_batch": sorted(seen), "info": info["serving"]}
                for n_clients, n_requests in zip(clients, per_level):
                    for decoding in decodings:
                        bar.set_postfix_str(f"{count} replica(s), {n_clients} client(s), {decoding}")
                        level = run_level(
                            url, Level(count, decoding, n_clients), n_requests, prompts, seed, timeout, bar.update
                        )
                        seed += n_requests
                        rows.append(summarize(level))
                        servers[count]["exact_max_batch"] = sorted(
                            set(servers[count]["exact_max_batch"]) | level.exact_max_batch
                        )
    return rows, servers


# --- the report -------------------------------------------------------------------------------------------------


def _cell(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| replicas | decoding | clients | requests | images/s | p50 s | p95 s | images per call | auto chose exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = "-" if r["decoding"] != "auto" else f"{r['exact_share']:.0%}"
        errors = f" ({r['errors']} failed)" if r["errors"] else ""
        lines.append(
            f"| {r['replicas']} | {r['decoding']} | {r['clients']} | {r['requests']}{errors} | "
            f"{_cell(r['throughput'])} | {_cell(r['p50'])} | {_cell(r['p95'])} | {_cell(r['call_images'], 1)} | "
            f"{share} |"
        )
    return lines


def targets(rows: list[dict]) -> tuple[list[str], bool]:
    """The issue's targets, met or missed, per replica count: (lines, all met)."""
    lines, met = [], True
    by = {(r["replicas"], r["decoding"], r["clients"]): r for r in rows}
    for count in sorted({r["replicas"] for r in rows}):
        levels = sorted({c for (n, d, c) in by if n == count and d == "auto"})
        worst = None
        for clients in levels:
            auto = by[(count, "auto", clients)]["throughput"]
            better = max(by.get((count, d, clients), {}).get("throughput", float("nan")) for d in ("ar", "exact"))
            if not (math.isnan(auto) or math.isnan(better)):
                ratio = auto / better
                worst = (ratio, clients) if worst is None or ratio < worst[0] else worst
        if worst is not None:
            ok = worst[0] >= TARGET_AUTO
            met &= ok
            lines.append(
                f"- {count} replica(s): `auto`'s throughput is at least {worst[0]:.2f}x the better of `ar` and "
                f"`exact` at every load (lowest at {worst[1]} clients; target >= {TARGET_AUTO}): "
                f"{'met' if ok else 'missed'}."
            )
        if (count, "auto", 1) in by and (count, "ar", 1) in by:
            ratio = by[(count, "ar", 1)]["p50"] / by[(count, "auto", 1)]["p50"]
            ok = ratio >= TARGET_LATENCY
            met &= ok
            lines.append(
                f"- {count} replica(s): p50 latency at 1 client, `auto` {by[(count, 'auto', 1)]['p50']:.2f} s against "
                f"`ar` {by[(count, 'ar', 1)]['p50']:.2f} s, {ratio:.2f}x better (target >= {TARGET_LATENCY}x): "
                f"{'met' if ok else 'missed'}."
            )
    return lines, met


COLOURS = {"ar": "black", "exact": "tab:cyan", "auto": "tab:orange"}


def plot(rows: list[dict], out: Path) -> None:
    """Throughput and p50 latency against clients, one line per decoding x replicas (dashed: 2 replicas)."""
    from ssd_pipelines.plots import pyplot

    from .plots import _plain_log_ticks

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), dpi=110)
    series: dict[tuple[int, str], list[dict]] = {}
    for r in rows:
        series.setdefault((r["replicas"], r["decoding"]), []).append(r)
    for (count, decoding), points in series.items():
        points = sorted(points, key=lambda r: r["clients"])
        x = [p["clients"] for p in points]
        style = {
            "color": COLOURS.get(decoding, "grey"),
            "linestyle": "-" if count == 1 else "--",
            "marker": "o" if count == 1 else "s",
            "markersize": 4,
            "label": f"{decoding}, {count} replica{'s' if count > 1 else ''}",
        }
        axes[0].plot(x, [p["throughput"] for p in points], **style)
        axes[1].plot(x, [p["p50"] for p in points], **style)
    clients = sorted({r["clients"] for r in rows})
    for ax, label in zip(axes, ("images per second", "p50 latency, s (log)")):
        ax.set_xscale("log", base=2)
        _plain_log_ticks(ax.xaxis, clients)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 2, 3, 10 rather than 2x10^0
    axes[1].yaxis.set_major_formatter(plain)
    axes[1].yaxis.set_minor_formatter(plain)
    axes[0].set_title("Throughput")
    axes[1].set_title("Median latency")
    axes[1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def render(rows, servers, args, machine: str, figure: Path) -> list[str]:
    target_lines, met = targets(rows)
    crossovers = "; ".join(
        f"{count} replica(s): `exact_max_batch` {', '.join(map(str, s['exact_max_batch'])) or '?'} "
        f"({s['info'].get('exact_max_batch_source', '?')})"
        for count, s in servers.items()
    )
    measured = [s["info"]["crossover"] for s in servers.values() if isinstance(s["info"].get("crossover"), dict)]
    per_image = ""
    if measured:
        timings = measured[0]["seconds_per_image"]
        per_image = (
            " One replica's start-up measurement (seconds per image, exact / ar, by batch): "
            + ", ".join(f"{b}: {t['exact']:.2f} / {t['ar']:.2f}" for b, t in timings.items())
            + f", in {measured[0]['measure_s']:.0f} s."
        )
    return [
        (
            f"The reference model on a local Ray Serve app (`serving.deployment.build_app`, loopback HTTP), "
            f"{args.threads} torch thread and {args.threads} Ray CPU per replica, `--max-batch-size "
            f"{args.max_batch_size}`, `--batch-wait-timeout-s {args.batch_wait_timeout_s}`, `auto` with "
            f"`exact_max_batch={args.exact_max_batch}`. {machine}"
        ),
        "",
        (
            f'At each load level, that many clients send requests back to back (one image each, `response="png"`, '
            f"distinct seeds, held-out reference captions) until {args.requests} requests (at least one per client) "
            "are answered; `ar`, `exact` and `auto` run one after another at each level. Images/s: answered images "
            "over the level's wall time; p50, p95: a request's round trip, batching and queueing included; images "
            "per call: the mean size of the pipeline call a request ran in; auto chose exact: its requests decoded "
            f"by `exact`. Crossovers the servers used: {crossovers}.{per_image} With "
            f"{args.requests} requests a level, a percentile is a few requests' worth: the numbers are noisy by "
            "10 to 20 % on this shared CPU."
        ),
        "",
        *table(rows),
        "",
        "## Targets",
        "",
        (
            f"The issue's targets: `auto`'s throughput within 10 % of the better of `ar` and `exact` at every load, "
            f"and p50 latency at 1 client at least {TARGET_LATENCY}x better than `ar`'s. "
            + ("All met in this run." if met else "Not all met in this run:")
        ),
        "",
        *target_lines,
        "",
        f"![throughput and p50 latency against concurrent clients]({figure.name})",
    ]


def main(argv: list[str] | None = None) -> None:
    args = commands.serve_parser().parse_args(argv)
    if args.exact_max_batch != "measure":
        args.exact_max_batch = int(args.exact_max_batch)
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    started = datetime.datetime.now()
    rows, servers = run(
        args.model,
        args.replicas,
        args.clients,
        args.decodings,
        args.requests,
        args.threads,
        args.exact_max_batch,
        args.max_batch_size,
        args.batch_wait_timeout_s,
        args.timeout,
    )
    minutes = (datetime.datetime.now() - started).total_seconds() / 60
    machine = (
        f"{platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}; load average {load:.1f} at the "
        "start" + (f"; {args.note}" if args.note else "") + f". Run {started:%Y-%m-%d %H:%M}, {minutes:.0f} minutes."
    )
    figure = args.out.with_suffix(".png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, figure)
    report(render(rows, servers, args, machine, figure), args.out, "Serving under load", "ssd-bench serve")


if __name__ == "__main__":
    main()
