"""Decoding strategies: each method its own class behind `DecodingStrategy`.

Each class declares what a caller needs to know of it (`summary`, `lossless`,
`needs_heads`, `options`); the functions here answer from those declarations, so
that the pipeline, the CLI, the demo and the ComfyUI node never keep a table of
their own."""

from __future__ import annotations

from ..heads import DraftHeads
from .ar import ARDecoding
from .auto import AutoDecoding
from .base import UNDECODED, DecodeOutput, DecodeStats, DecodingStrategy, RowCallback
from .exact import ExactDecoding
from .gsd import GSDDecoding
from .mtp1d import MTP1DDecoding
from .options import DecodingOption
from .sjd import SJDDecoding
from .sjd_pac import SJDPACDecoding
from .ssd import SSDDecoding
from .zipar import ZipARDecoding

STRATEGIES: dict[str, type[DecodingStrategy]] = {
    "ar": ARDecoding,
    "ssd": SSDDecoding,
    "exact": ExactDecoding,
    "auto": AutoDecoding,
    "sjd": SJDDecoding,
    "sjd-pac": SJDPACDecoding,
    "gsd": GSDDecoding,
    "mtp1d": MTP1DDecoding,
    "zipar": ZipARDecoding,
}
# The default is lossless: `ssd-bench reference` (docs/reference_benchmark.md) names `exact` the one decoding that keeps
# AR's look and adherence, and `auto` decodes a batch with it up to the CPU's crossover, past it with `ar`.
DEFAULT_DECODING = "auto"
# What the demo and the ComfyUI node offer; the peers are for benchmarks.
USER_DECODINGS = ("auto", "ssd", "exact", "ar")


def strategy_class(name: str) -> type[DecodingStrategy]:
    """The strategy called `name`; a ValueError lists the ones there are."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown decoding {name!r}: choose one of {', '.join(STRATEGIES)}.")
    return STRATEGIES[name]


def decoding_label(stats: dict) -> str:
    """What decoded a call, from its statistics: the strategy's name, and what `auto` chose, e.g. "auto (exact)"."""
    name, chosen = stats["strategy"], stats.get("chosen_decoding")
    return name if chosen in (None, name) else f"{name} ({chosen})"


def option_default(decoding: str, option: str) -> int | None:
    """The default of one of a decoding's options, e.g. option_default("ssd", "verify_rounds") == 2."""
    return strategy_class(decoding).option(option).default


def options_for(decoding: str, **values) -> dict:
    """Of the values given, the ones `decoding` takes and that are not None: what a caller passes to `pipe(...)`
    when one set of controls serves several decodings (the CLI's --compare, the demo, the ComfyUI node)."""
    names = strategy_class(decoding).option_names()
    return {name: value for name, value in values.items() if name in names and value is not None}


def check_options(decoding: str, **values) -> None:
    """Raise a ValueError that says what to change if `decoding` does not take one of the values that are not
    None, or a value is out of its range."""
    cls = strategy_class(decoding)
    for name, value in values.items():
        if value is None:
            continue
        if name not in cls.option_names():
            takers = [d for d, c in STRATEGIES.items() if name in c.option_names()]
            raise ValueError(
                f"{name} applies to decoding={' or '.join(map(repr, takers))} only, not {decoding!r}: drop {name}"
                + (f", or use decoding={takers[0]!r}." if len(takers) == 1 else ".")
            )
        cls.option(name).check(decoding, value)


def make_strategy(name: str, heads: DraftHeads | None = None, **options) -> DecodingStrategy:
    """Build a strategy by name, e.g. make_strategy("ssd", heads, verify_rounds=1)."""
    cls = strategy_class(name)
    if cls.needs_heads:
        if heads is None:
            raise ValueError(f"decoding {name!r} drafts with drafting heads: pass heads=..., or use decoding='ar'.")
        return cls(heads, **options)
    return cls(**options)


__all__ = [
    "DEFAULT_DECODING",
    "STRATEGIES",
    "UNDECODED",
    "USER_DECODINGS",
    "ARDecoding",
    "AutoDecoding",
    "DecodeOutput",
    "DecodeStats",
    "DecodingOption",
    "DecodingStrategy",
    "ExactDecoding",
    "GSDDecoding",
    "MTP1DDecoding",
    "RowCallback",
    "SJDDecoding",
    "SJDPACDecoding",
    "SSDDecoding",
    "ZipARDecoding",
    "check_options",
    "decoding_label",
    "make_strategy",
    "option_default",
    "options_for",
    "strategy_class",
]
