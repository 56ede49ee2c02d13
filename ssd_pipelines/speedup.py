"""A decoding against `ar`, in the words a user reads: how many times fewer passes, how many times faster or slower.

A ratio below 1 printed as "0.9x less time" reads like a speedup; every face (ssd-generate --compare, the demo)
says it here, one way.
"""

from __future__ import annotations

SAME = 0.05  # within 5% of ar: "as fast as ar", not "1.0x faster"


def against_ar(stats: dict, ar: dict) -> str:
    """E.g. "2.9x fewer forward passes and 1.2x faster than ar", or "... and 1.1x slower than ar"."""
    passes = _times(ar["forward_passes"] / stats["forward_passes"], "fewer forward passes", "more forward passes")
    ratio = ar["seconds"] / stats["seconds"]
    speed = "as fast as ar" if abs(ratio - 1) < SAME else f"{_times(ratio, 'faster', 'slower')} than ar"
    return f"{passes} and {speed}"


def _times(ratio: float, more: str, less: str) -> str:
    """`ratio` (ar's over ours) as "N.Nx more" at or above 1, below it as "N.Nx less" by its inverse."""
    return f"{ratio:.1f}x {more}" if ratio >= 1 else f"{1 / ratio:.1f}x {less}"
