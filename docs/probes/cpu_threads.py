"""Probe (a record, not part of the package): how many torch threads the README's Python example should use.

Each run is a fresh process that loads the reference model and makes the example's two calls (two images with
`auto`, then one with `ssd` r=2), timed together; torch's default (one thread a core) and one thread alternate,
on an idle machine and then beside a process that keeps one core busy, as other work on a shared machine does.

    python docs/probes/cpu_threads.py

Result (README, "Use the pipeline"), on this project's 2-core CPU: idle, torch's 2 threads 2.13 and 2.15 s, one
thread 2.60 and 2.73 s (1.25x slower); beside a busy core, 2 threads 7.28 and 9.28 s, one thread 2.53 and 2.58 s
(3 to 3.6x faster).
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = f"""
import os, time, torch
from ssd_pipelines import SSDAutoregressivePipeline
if os.environ.get("THREADS"):
    torch.set_num_threads(int(os.environ["THREADS"]))
pipe = SSDAutoregressivePipeline.from_pretrained({str(ROOT / "hub_cards" / "ssd-reference")!r})
pipe.set_progress_bar_config(disable=True)
started = time.perf_counter()
pipe("three green triangles", num_images_per_prompt=2, guidance_scale=3.0, generator=torch.Generator().manual_seed(0))
pipe("three green triangles", decoding="ssd", verify_rounds=2)
print(f"{{torch.get_num_threads()}} threads: {{time.perf_counter() - started:.2f}} s")
"""


def run(threads: str) -> str:
    env = {**os.environ, "THREADS": threads}
    return subprocess.run([sys.executable, "-c", EXAMPLE], env=env, capture_output=True, text=True, check=True).stdout


for busy in (False, True):
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        for _ in range(2):
            for threads in ("", "1"):
                print(("beside a busy core: " if busy else "idle: ") + run(threads), end="", flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
