"""What a caller knows of each decoding before making one, declared once and free of torch.

Each decoding's summary, whether it is lossless, whether it drafts with heads and the options it takes live here;
the strategy classes read their declarations from this table (`DecodingStrategy.__init_subclass__`), and the
command lines, the server, the demo and the ComfyUI node build their choices, flags and checks from it. Importing
it costs no torch, so `ssd-generate --help` answers before the model's libraries load.
"""

from __future__ import annotations

from dataclasses import dataclass

from .options import EXACT_MAX_BATCH, VERIFY_ROUNDS, VERTICAL_ROWS, WINDOW, DecodingOption


@dataclass(frozen=True)
class DecodingInfo:
    """One decoding, as callers see it; `implementation` is where its strategy class lives ("package.module.Class"
    under ssd_pipelines: the engine's in decoding/, the peers' in peers/), imported only when a strategy is made."""

    name: str
    implementation: str
    summary: str  # one line for a chooser: what it does, and whether its images are the model's own; peers: "peer, ..."
    lossless: bool  # samples exactly the distribution of the model's own (AR) decoder
    needs_heads: bool = False  # drafts with `DraftHeads`
    options: tuple[DecodingOption, ...] = ()  # what `pipe(...)` may pass to it; peers: none

    @property
    def peer(self) -> bool:
        """A published method we compare with (`ssd-bench peers`), not one we offer: it lives in peers/."""
        return self.implementation.startswith("peers.")

    def option(self, name: str) -> DecodingOption:
        """The declared option `name`; a ValueError names the ones this decoding takes."""
        for option in self.options:
            if option.name == name:
                return option
        raise ValueError(f"decoding {self.name!r} takes no option {name!r}: it takes {self.option_names() or 'none'}.")

    def option_names(self) -> tuple[str, ...]:
        return tuple(option.name for option in self.options)


ENGINE: tuple[DecodingInfo, ...] = (  # the product: what users decode with
    DecodingInfo(
        "ar",
        "decoding.ar.ARDecoding",
        "the model's own decoder: one code per forward pass, the baseline",
        lossless=True,
    ),
    DecodingInfo(
        "ssd",
        "decoding.ssd.SSDDecoding",
        "lossy, fastest: the paper's SSD, verify_rounds verification rounds per row",
        lossless=False,
        needs_heads=True,
        options=(VERIFY_ROUNDS, VERTICAL_ROWS, WINDOW),
    ),
    DecodingInfo(
        "exact",
        "decoding.exact.ExactDecoding",
        "lossless: the same distribution as ar (a different sample of it), in fewer passes",
        lossless=True,
        needs_heads=True,
        options=(WINDOW,),
    ),
    DecodingInfo(
        "auto",
        "decoding.auto.AutoDecoding",
        "lossless: exact for batches of at most exact_max_batch images, ar for larger ones",
        lossless=True,
        needs_heads=True,
        options=(EXACT_MAX_BATCH, WINDOW),
    ),
)
PEERS: tuple[DecodingInfo, ...] = (  # published methods we measure against (ssd-bench peers), not offered
    DecodingInfo(
        "sjd", "peers.sjd.SJDDecoding", "peer, lossless: speculative Jacobi decoding, training-free", lossless=True
    ),
    DecodingInfo(
        "sjd-pac",
        "peers.sjd_pac.SJDPACDecoding",
        "peer, lossless: speculative Jacobi decoding with a tree of continuations",
        lossless=True,
    ),
    DecodingInfo(
        "gsd",
        "peers.gsd.GSDDecoding",
        "peer, lossy: speculative Jacobi decoding with grouped acceptance",
        lossless=False,
    ),
    DecodingInfo(
        "mtp1d",
        "peers.mtp1d.MTP1DDecoding",
        "peer, lossless: 1-D multi-token drafts along the row, rolled back at the first rejection",
        lossless=True,
        needs_heads=True,
    ),
    DecodingInfo(
        "zipar",
        "peers.zipar.ZipARDecoding",
        "peer, lossy: each row starts a few cells behind the row above, unverified",
        lossless=False,
    ),
)
DECODINGS: dict[str, DecodingInfo] = {info.name: info for info in (*ENGINE, *PEERS)}
# The default is lossless: `ssd-bench reference` (docs/reference_benchmark.md) names `exact` the one decoding that keeps
# AR's look and adherence, and `auto` decodes a batch with it up to the CPU's crossover, past it with `ar`.
DEFAULT_DECODING = "auto"
# What the demo and the ComfyUI node offer; the peers are for benchmarks.
USER_DECODINGS = ("auto", "ssd", "exact", "ar")


def decoding_info(name: str) -> DecodingInfo:
    """The decoding called `name`; a ValueError lists the ones there are."""
    if name not in DECODINGS:
        raise ValueError(f"unknown decoding {name!r}: choose one of {', '.join(DECODINGS)}.")
    return DECODINGS[name]


def decoding_options() -> dict[str, tuple[DecodingOption, list[str]]]:
    """Every option of the decodings, by name: (its declaration, the decodings that take it), in the table's order."""
    found: dict[str, tuple[DecodingOption, list[str]]] = {}
    for info in DECODINGS.values():
        for option in info.options:
            found.setdefault(option.name, (option, []))[1].append(info.name)
    return found


def decoding_label(stats: dict) -> str:
    """What decoded a call, from its statistics: the strategy's name, and what `auto` chose, e.g. "auto (exact)"."""
    name, chosen = stats["strategy"], stats.get("chosen_decoding")
    return name if chosen in (None, name) else f"{name} ({chosen})"


def option_default(decoding: str, option: str) -> int | None:
    """The default of one of a decoding's options, e.g. option_default("ssd", "verify_rounds") == 2."""
    return decoding_info(decoding).option(option).default


def options_for(decoding: str, **values) -> dict:
    """Of the values given, the ones `decoding` takes and that are not None: what a caller passes to `pipe(...)`
    when one set of controls serves several decodings (the CLI's --compare, the demo, the ComfyUI node)."""
    names = decoding_info(decoding).option_names()
    return {name: value for name, value in values.items() if name in names and value is not None}


def check_options(decoding: str, **values) -> None:
    """Raise a ValueError that says what to change if `decoding` does not take one of the values that are not
    None, or a value is out of its range."""
    info = decoding_info(decoding)
    for name, value in values.items():
        if value is None:
            continue
        if name not in info.option_names():
            takers = [d for d, other in DECODINGS.items() if name in other.option_names()]
            raise ValueError(
                f"{name} applies to decoding={' or '.join(map(repr, takers))} only, not {decoding!r}: drop {name}"
                + (f", or use decoding={takers[0]!r}." if len(takers) == 1 else ".")
            )
        info.option(name).check(decoding, value)
