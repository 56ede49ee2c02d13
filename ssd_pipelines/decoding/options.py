"""The options a decoding strategy takes from a caller: catalog.py says which decoding takes which, and everyone
reads them there.

The pipeline checks a call's options against the decoding's declaration; the
CLI, the demo and the ComfyUI node build their controls and defaults from it and
pass only the options a decoding takes. So "which option applies to which
decoding", its default and its range are written once.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodingOption:
    """One integer option of a decoding, as `pipe(...)` takes it (None: the strategy's own default)."""

    name: str
    default: int | None  # what the strategy uses when the caller passes None; None means "off" (see `about`)
    minimum: int
    about: str  # one line for a help text or a tooltip

    def check(self, decoding: str, value) -> None:
        """Raise a ValueError that says what to pass, unless `value` is None or an integer in range.

        Floats are refused, not truncated: `verify_rounds=2.7` is a caller's mistake, not a 2."""
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < self.minimum:
            raise ValueError(
                f"`{self.name}` must be an integer >= {self.minimum} for decoding={decoding!r} ({self.about}), "
                f"got {value!r}."
            )


VERIFY_ROUNDS = DecodingOption("verify_rounds", 2, 0, "the most verification rounds per row; 0 keeps drafts unverified")
VERTICAL_ROWS = DecodingOption("vertical_rows", 1, 1, "rows the vertical heads draft at once")
WINDOW = DecodingOption("window", None, 1, "image positions verified per pass; default one row")
EXACT_MAX_BATCH = DecodingOption(
    "exact_max_batch", 1, 0, "the largest batch decoded with exact; larger ones with ar (0: always ar)"
)
