"""Decoding strategies: each method its own class behind `DecodingStrategy`.

What a caller needs to know of a decoding before making one (`summary`, `lossless`, `needs_heads`, `options`) is
declared once, in `catalog.py`, and the functions here answer from it, so that the pipeline, the CLI, the demo and
the ComfyUI node never keep a table of their own. The catalog needs no torch; the strategy classes (and
`STRATEGIES`) are imported on first use (PEP 562), so a command line can build its flags before torch loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .catalog import (
    DECODINGS,
    DEFAULT_DECODING,
    USER_DECODINGS,
    DecodingInfo,
    check_options,
    decoding_info,
    decoding_label,
    decoding_options,
    option_default,
    options_for,
)
from .options import DecodingOption

if TYPE_CHECKING:
    from ..heads import DraftHeads
    from .strategy import DecodingStrategy

_TYPES = {  # the types of the strategy interface, by the module that declares each
    "UNDECODED": "output",
    "DecodeOutput": "output",
    "DecodeStats": "output",
    "DecodingStrategy": "strategy",
    "RowCallback": "strategy",
}
_CLASS_DECODING = {info.implementation.rpartition(".")[2]: name for name, info in DECODINGS.items()}  # ARDecoding: ar


def strategy_class(name: str) -> type[DecodingStrategy]:
    """The strategy called `name` (its module imported now); a ValueError lists the ones there are."""
    module, _, cls = decoding_info(name).implementation.rpartition(".")
    return getattr(importlib.import_module(f"ssd_pipelines.{module}"), cls)


def make_strategy(name: str, heads: DraftHeads | None = None, **options) -> DecodingStrategy:
    """Build a strategy by name, e.g. make_strategy("ssd", heads, verify_rounds=1)."""
    cls = strategy_class(name)
    if cls.needs_heads:
        if heads is None:
            raise ValueError(f"decoding {name!r} drafts with drafting heads: pass heads=..., or use decoding='ar'.")
        return cls(heads, **options)
    return cls(**options)


def __getattr__(attribute: str):
    """The strategy classes, `STRATEGIES` (every one of them, by name) and the interface's types, imported when
    asked for."""
    if attribute in _CLASS_DECODING:
        value = strategy_class(_CLASS_DECODING[attribute])
    elif attribute == "STRATEGIES":
        value = {name: strategy_class(name) for name in DECODINGS}
    elif attribute in _TYPES:
        value = getattr(importlib.import_module(f".{_TYPES[attribute]}", __name__), attribute)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    globals()[attribute] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DECODINGS",
    "DEFAULT_DECODING",
    "STRATEGIES",
    "UNDECODED",
    "USER_DECODINGS",
    "ARDecoding",
    "AutoDecoding",
    "DecodeOutput",
    "DecodeStats",
    "DecodingInfo",
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
    "decoding_info",
    "decoding_label",
    "decoding_options",
    "make_strategy",
    "option_default",
    "options_for",
    "strategy_class",
]
