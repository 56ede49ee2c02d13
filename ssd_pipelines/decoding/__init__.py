"""Decoding strategies: each method its own class behind `DecodingStrategy`."""

from __future__ import annotations

from ..heads import DraftHeads
from .ar import ARDecoding
from .base import UNDECODED, DecodeOutput, DecodeStats, DecodingStrategy, RowCallback
from .exact import ExactDecoding
from .gsd import GSDDecoding
from .mtp1d import MTP1DDecoding
from .sjd import SJDDecoding
from .sjd_pac import SJDPACDecoding
from .ssd import SSDDecoding
from .zipar import ZipARDecoding

STRATEGIES: dict[str, type[DecodingStrategy]] = {
    "ar": ARDecoding,
    "ssd": SSDDecoding,
    "exact": ExactDecoding,
    "sjd": SJDDecoding,
    "sjd-pac": SJDPACDecoding,
    "gsd": GSDDecoding,
    "mtp1d": MTP1DDecoding,
    "zipar": ZipARDecoding,
}
NEEDS_HEADS = {"ssd", "exact", "mtp1d"}


def make_strategy(name: str, heads: DraftHeads | None = None, **options) -> DecodingStrategy:
    """Build a strategy by name, e.g. make_strategy("ssd", heads, verify_rounds=1)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown decoding {name!r}: choose one of {', '.join(STRATEGIES)}.")
    if name in NEEDS_HEADS:
        if heads is None:
            raise ValueError(f"decoding {name!r} drafts with drafting heads: pass heads=..., or use decoding='ar'.")
        return STRATEGIES[name](heads, **options)
    return STRATEGIES[name](**options)


__all__ = [
    "STRATEGIES",
    "UNDECODED",
    "ARDecoding",
    "DecodeOutput",
    "DecodeStats",
    "DecodingStrategy",
    "ExactDecoding",
    "GSDDecoding",
    "MTP1DDecoding",
    "RowCallback",
    "SJDDecoding",
    "SJDPACDecoding",
    "SSDDecoding",
    "ZipARDecoding",
    "make_strategy",
]
