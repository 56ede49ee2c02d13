"""Probe (a record, not part of the package): does `enable_compiled_passes()` pay on a CPU?

The reference model, one torch thread, one image a call, output_type="latent": the median of three warm eager
calls, then `enable_compiled_passes()` (its defaults: inductor, dynamic=True), its first call (the compilation)
and the median of three calls after it.

    python docs/probes/compiled_on_cpu.py auto    # and: ssd

Result (docs/decoding.md, "Compiled passes"), on this project's 2-core CPU beside other work: `auto` (one image:
`exact`) eager 1.32 s a call; compiled, first call 149 s, then 1.46 s. `ssd` (r=2) eager 0.97 s; inductor failed on
the backbone's pass, which then ran eagerly with the steps between passes compiled: first call 39 s, then 0.74 s.
"""

import statistics
import sys
import time

import torch

from ssd_pipelines import SSDAutoregressivePipeline

torch.set_num_threads(1)
decoding = sys.argv[1] if len(sys.argv) > 1 else "auto"
pipe = SSDAutoregressivePipeline.from_pretrained("hub_cards/ssd-reference")
pipe.set_progress_bar_config(disable=True)


def seconds(seed: int) -> float:
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    pipe("a red circle", decoding=decoding, generator=generator, output_type="latent")
    return time.perf_counter() - started


seconds(0)
eager = statistics.median(seconds(seed) for seed in (1, 2, 3))
pipe.enable_compiled_passes()
first = seconds(0)
compiled = statistics.median(seconds(seed) for seed in (1, 2, 3))
print(f"{decoding}: eager {eager:.2f} s a call; compiled: first call {first:.0f} s, then {compiled:.2f} s a call")
