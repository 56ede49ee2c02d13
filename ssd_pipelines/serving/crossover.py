"""The crossover of `auto` on this machine: the largest batch that `exact` still decodes faster per image than `ar`.

`auto` decodes a call of at most `exact_max_batch` images with `exact` and a larger one with `ar` (decoding/auto.py).
Where the two cross depends on the machine, its threads, its load and the model, so a server can measure it once at
start-up (`ssd-serve --exact-max-batch measure`): `measure_crossover(pipe)` times both on the same short prompts
(captions of held-out reference scenes) and seeds at batches 1, 2, 3, 4, 6 and 8, interleaved so that a change in
the machine's load hits both alike, after one untimed call of each. It stops once `exact` has been slower at two
sizes in a row: speculative decoding only falls further behind as the batch grows.

One repeat per size (the default) takes about 20 to 40 s for the reference model on one CPU thread. Timings on a
shared CPU are noisy by 10 to 20 %, which can move the answer by a size where the two are close; there, either
choice costs little, since they are close. Both decodings are lossless, so the crossover changes speed only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..reference.scenes import HELDOUT_SEED_START, sample_scene

BATCH_SIZES = (1, 2, 3, 4, 6, 8)
SEED = 1234


@dataclass
class Crossover:
    """The measured crossover and what it came from: batch -> (exact, ar) median seconds per image."""

    exact_max_batch: int
    per_image: dict[int, tuple[float, float]] = field(default_factory=dict)
    seconds: float = 0.0  # the whole measurement, warm-up included

    def as_dict(self) -> dict:
        return {
            "exact_max_batch": self.exact_max_batch,
            "seconds_per_image": {
                b: {"exact": round(e, 4), "ar": round(a, 4)} for b, (e, a) in sorted(self.per_image.items())
            },
            "measure_s": round(self.seconds, 1),
        }


def pick_crossover(per_image: dict[int, tuple[float, float]]) -> int:
    """The largest measured batch up to which `exact` beat `ar` at every measured size (0: not even at the first).

    A size where `exact` wins again after losing (noise, on a shared machine) does not count: `auto` uses one
    threshold, and a batch between two losing sizes is no better a bet."""
    chosen = 0
    for batch in sorted(per_image):
        exact, ar = per_image[batch]
        if exact >= ar:
            break
        chosen = batch
    return chosen


def captions(count: int) -> list[str]:
    """Short prompts: captions of held-out reference scenes (the same ones on every machine)."""
    return [sample_scene(HELDOUT_SEED_START + 700_000 + i).caption for i in range(count)]


def time_call(pipe, prompts: list[str], decoding: str, seed: int, clock: Callable[[], float] = time.perf_counter):
    """Seconds of one pipeline call decoding `prompts` to codes, one generator per image."""
    generators = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
    started = clock()
    pipe(prompts, decoding=decoding, generator=generators, output_type="latent")
    return clock() - started


def measure_crossover(pipe, max_batch: int = 8, repeats: int = 1, **kwargs) -> int:
    """The largest batch at which `exact` is still faster per image than `ar` on this machine (0: never);
    `measure` says what it came from."""
    return measure(pipe, max_batch, repeats, **kwargs).exact_max_batch


def measure(
    pipe,
    max_batch: int = 8,
    repeats: int = 1,
    sizes: Sequence[int] = BATCH_SIZES,
    timer: Callable[..., float] = time_call,
    on_call: Callable[[], None] | None = None,
) -> Crossover:
    """Time `exact` against `ar` per image at `sizes` up to `max_batch` (median of `repeats` calls each) and
    return the crossover (`Crossover.exact_max_batch`, see `pick_crossover`). `timer(pipe, prompts, decoding,
    seed)` gives one call's seconds (the default runs it); `on_call` is told after each call."""
    if max_batch < 1 or repeats < 1:
        raise ValueError(f"max_batch and repeats must be >= 1, got {max_batch}, {repeats}.")
    if pipe.heads is None:  # exact needs heads, and so does auto: nothing to choose between
        return Crossover(0)
    started = time.perf_counter()
    batches = [b for b in sorted(sizes) if b <= max_batch]
    prompts = captions(max(batches, default=1))
    for decoding in ("exact", "ar"):  # warm-up, untimed: the first call pays for allocation
        timer(pipe, prompts[:1], decoding, SEED)
        if on_call:
            on_call()
    per_image: dict[int, tuple[float, float]] = {}
    behind = 0
    for batch in batches:
        times: dict[str, list[float]] = {"exact": [], "ar": []}
        for rep in range(repeats):
            for decoding in ("exact", "ar"):
                times[decoding].append(timer(pipe, prompts[:batch], decoding, SEED + rep * 100) / batch)
                if on_call:
                    on_call()
        per_image[batch] = (statistics.median(times["exact"]), statistics.median(times["ar"]))
        behind = behind + 1 if per_image[batch][0] >= per_image[batch][1] else 0
        if behind >= 2:  # slower at two sizes in a row: it only falls further behind
            break
    return Crossover(pick_crossover(per_image), per_image, time.perf_counter() - started)
