"""Probe (a record, not part of the package): are `ssd-bench reference`'s seeded images the same after a refactor?

Runs the benchmark's adherence step for each of its decodings on the first held-out prompts, one image each, guidance
3, four images a call, and prints a sha256 of every image. Run it with each tree first on PYTHONPATH and diff the
output; the benchmark's module is named because it moved (issue 50):

    PYTHONPATH=. python docs/probes/reference_codes.py ssd_bench.reference 8 > after.json
    PYTHONPATH=OLD python docs/probes/reference_codes.py ssd_pipelines.benchmarks.reference 8 > before.json

Result (issue 50): 7 decodings x 8 images, byte-identical on 305555a, 7338907 and d968ac1.
"""

import hashlib
import importlib
import json
import sys

import numpy as np
import torch

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.hub import default_model
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene


def main() -> None:
    benchmark, prompts = importlib.import_module(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    pipe = SSDAutoregressivePipeline.from_pretrained(default_model(), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(prompts)]
    digests = {}
    for label, options in benchmark.DECODINGS.items():
        run = benchmark.adherence(pipe, label, options, scenes, 1, 4, 3.0)
        digests[label] = [
            hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()[:12] for image in run["images"]
        ]
        digests[f"{label} adherence"] = run["adherence"]
    print(json.dumps(digests, indent=1))


if __name__ == "__main__":
    main()
