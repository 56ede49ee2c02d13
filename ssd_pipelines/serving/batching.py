"""Running a batch of validated jobs on one pipeline: one call per group of jobs that share their options.

Jobs with different decodings, sizes, guidance or sampling cannot share a pipeline call, so a batch is split
into groups of identical options (`Job.group`), each decoded in one call with its prompts repeated once per image
and one generator per image, seeded `seed + j`: an image then depends on its own prompt, seed and options only,
not on what it is batched with (docs/decoding.md, "Seeds that do not depend on the batch").

A group whose call fails is rerun job by job, so that one failing job never takes the others down; each job
gets its result or its own exception, never nothing. All the state of a batch lives in this call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .request import Job, generators


@dataclass
class Generated:
    """One job's images, codes [n, R, C] and stats: the pipeline's for the call it ran in, plus `serving`."""

    images: list
    codes: torch.Tensor
    stats: dict
    warnings: list[str]
    seeds: list[int]


def run_batch(pipe, jobs: list[Job]) -> list[Generated | Exception]:
    """Decode every job; the result at position i is job i's `Generated`, or the exception its call raised."""
    outcomes: list[Generated | Exception | None] = [None] * len(jobs)
    groups: dict[tuple, list[int]] = {}
    for index, job in enumerate(jobs):
        groups.setdefault(job.group, []).append(index)
    for members in groups.values():
        try:
            results = _call(pipe, [jobs[i] for i in members], len(jobs))
        except Exception as error:  # noqa: BLE001 (each job is rerun alone below, or gets this error)
            if len(members) == 1:
                outcomes[members[0]] = error
                continue
            results = []
            for i in members:  # one job's fault must not fail the others
                try:
                    results += _call(pipe, [jobs[i]], len(jobs))
                except Exception as alone:  # noqa: BLE001 (handed to that job's caller)
                    results.append(alone)
        for i, result in zip(members, results):
            outcomes[i] = result
    return outcomes


def _call(pipe, jobs: list[Job], batch_size: int) -> list[Generated]:
    """One pipeline call for jobs of one group; the results in the jobs' order."""
    first = jobs[0]
    started = time.perf_counter()
    prompts = [job.prompt for job in jobs for _ in range(job.num_images)]
    negatives = (
        None if first.negative_prompt is None else [job.negative_prompt for job in jobs for _ in range(job.num_images)]
    )
    seeds = [seed for job in jobs for seed in job.seeds()]
    out = pipe(prompts, negative_prompt=negatives, generator=generators(seeds), **first.call_options())
    decoded = time.perf_counter() - started
    results, start = [], 0
    for job in jobs:
        end = start + job.num_images
        serving = {
            "batch_size": batch_size,  # requests in the batch this one was collected into
            "call_requests": len(jobs),  # requests that shared its pipeline call
            "call_images": len(out.images),
            "queue_s": round(started - job.received, 4),
            "decode_s": round(decoded, 4),
        }
        results.append(
            Generated(
                out.images[start:end],
                out.codes[start:end],
                {**out.stats, "serving": serving},
                job.warnings,
                job.seeds(),
            )
        )
        start = end
    return results
