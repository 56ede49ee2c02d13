"""The one rule for seeds, read by every face (the CLI, the bulk job, the server, the demo, the ComfyUI node).

A seed is a whole number from 0 to 2**64 - 1, what `torch.Generator.manual_seed` takes without wrapping around.
Where a call draws several images, image j draws from seed + j, so the last of them must stay in range too.
Kept free of torch so that a command line can check a seed before it loads anything.
"""

from __future__ import annotations

import numbers

MAX_SEED = 2**64 - 1


def check_seed(seed, count: int = 1, name: str = "seed") -> int:
    """`seed` as an int, or a ValueError that says what to pass; `count` images draw from seed .. seed + count - 1."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"{name} must be a whole number from 0 to {MAX_SEED}, got {seed!r}.")  # noqa: TRY004 (the faces catch one error type for every bad seed)
    last = MAX_SEED - max(count - 1, 0)
    if not 0 <= seed <= last:
        images = f" (image j of {count} draws from {name} + j)" if count > 1 else ""
        raise ValueError(f"{name} must be a whole number from 0 to {last}{images}, got {seed}.")
    return int(seed)
