"""Probe (a record, not part of the package): does `enable_compiled_passes()` pay on a CPU?

The reference model, one torch thread, one image a call, output_type="latent". For each decoding, side by side in
one run: the median of three warm eager calls, then `enable_compiled_passes()` (its defaults: inductor,
dynamic=True), its first call (the compilation) and the median of three calls after it, with what the calls' stats
say ran compiled and eagerly.

    python docs/probes/compiled_on_cpu.py ar exact ssd

Result: docs/decoding.md, "Compiled passes".
"""

import statistics
import sys
import time
import warnings

import torch

from ssd_pipelines import SSDAutoregressivePipeline

torch.set_num_threads(1)
decodings = sys.argv[1:] or ["auto"]
pipe = SSDAutoregressivePipeline.from_pretrained("hub_cards/ssd-reference")
pipe.set_progress_bar_config(disable=True)


def call(decoding: str, seed: int) -> tuple[float, dict]:
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    out = pipe("a red circle", decoding=decoding, generator=generator, output_type="latent")
    return time.perf_counter() - started, out.stats


rows = []
for decoding in decodings:
    call(decoding, 0)
    eager = statistics.median(call(decoding, seed)[0] for seed in (1, 2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU warning: measuring it is the point
        pipe.enable_compiled_passes()
    first, stats = call(decoding, 0)
    later = [call(decoding, seed) for seed in (1, 2, 3)]
    compiled = statistics.median(seconds for seconds, _ in later)
    ran = later[-1][1]
    rows.append(
        f"| `{decoding}` | {eager:.2f} s | {first:.0f} s | {compiled:.2f} s | {eager / compiled:.2f}x | "
        f"{ran['compiled_calls']} / {ran['eager_calls']} |"
    )
    pipe.disable_compiled_passes()
    torch._dynamo.reset()
print("| decoding | eager | compiled, first call | compiled, then | eager / compiled | calls compiled / eager |")
print("|---|---|---|---|---|---|")
print("\n".join(rows))
