"""Where a set of heads stands against the drafts' targets, from the rows of one `ssd-bench drafters` run.

The targets are what SSD promises (docs/drafters.md, "Against the targets"): a lossy mode that keeps AR's look and
prompt-following at 5x fewer passes, and a lossless `exact` 5x fewer passes and 2.5x faster than AR, with drafting a
small share of a call. The lossy mode judged is the one a default would be: the fewest passes among the lossy
decodings whose Fréchet distance is within `FRECHET_BUDGET` of AR's, or the paper's `ssd` r=2 when none is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .reference import FRECHET_BUDGET

PAPER_LOSSY = "ssd r=2"


@dataclass(frozen=True)
class Target:
    measure: str
    decoding: str  # "lossy" (the lossy decoding judged) or a decoding's label
    value: Callable[[dict, dict], float]  # (its row, AR's row) -> the measure
    bound: float
    at_least: bool  # met when the value is >= bound (else <=)
    fmt: str

    def met(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound


TARGETS = (
    Target("lossy: first-round acceptance", "lossy", lambda r, ar: r["acceptance"][0], 0.6, True, "{:.2f}"),
    Target(
        "lossy: Fréchet distance against AR's",
        "lossy",
        lambda r, ar: r["frechet"] / ar["frechet"],
        FRECHET_BUDGET,
        False,
        "{:.1f}x",
    ),
    Target(
        "lossy: adherence lost against AR",
        "lossy",
        lambda r, ar: max(0.0, -r["adherence_diff"]),
        0.03,
        False,
        "{:.3f}",
    ),
    Target("lossy: fewer passes than AR", "lossy", lambda r, ar: ar["passes"] / r["passes"], 5.0, True, "{:.1f}x"),
    Target("lossy: drafting share of a call", "lossy", lambda r, ar: r["drafting"], 0.15, False, "{:.0%}"),
    Target("exact: fewer passes than AR", "exact", lambda r, ar: ar["passes"] / r["passes"], 5.0, True, "{:.1f}x"),
    Target(
        "exact: faster than AR, one image",
        "exact",
        lambda r, ar: ar["seconds"] / r["seconds"],
        2.5,
        True,
        "{:.1f}x",
    ),
    Target("exact: drafting share of a call", "exact", lambda r, ar: r["drafting"], 0.15, False, "{:.0%}"),
)


def lossy_default(rows: dict[str, dict], ar: dict) -> str:
    """The lossy decoding a default would be (rows by decoding label, lossy ones only besides `exact`): the fewest
    passes within FRECHET_BUDGET of AR's Fréchet distance, else the paper's r=2."""
    lossy = {label: r for label, r in rows.items() if label != "exact"}
    within = [label for label, r in lossy.items() if r["frechet"] <= FRECHET_BUDGET * ar["frechet"]]
    return min(within, key=lambda label: lossy[label]["passes"]) if within else PAPER_LOSSY


def targets_table(rows: list[dict]) -> list[str]:
    """One column per heads: each target's value, and whether it is met. `rows` are the benchmark's, AR's first,
    each with heads, decoding, acceptance, frechet, adherence_diff, passes, seconds and drafting."""
    ar, heads = rows[0], list(dict.fromkeys(r["heads"] for r in rows[1:]))
    by_heads = {h: {r["decoding"]: r for r in rows[1:] if r["heads"] == h} for h in heads}
    lossy = {h: lossy_default(by_heads[h], ar) for h in heads}
    lines = [
        "| target | bound | " + " | ".join(heads) + " |",
        "|---|---|" + "---|" * len(heads),
        "| lossy decoding judged | fewest passes within "
        + f"{FRECHET_BUDGET}x AR's Fréchet, else {PAPER_LOSSY} | "
        + " | ".join(lossy[h] for h in heads)
        + " |",
    ]
    for target in TARGETS:
        cells = []
        for h in heads:
            row = by_heads[h][lossy[h] if target.decoding == "lossy" else target.decoding]
            value = target.value(row, ar)
            cells.append(target.fmt.format(value) + (" (met)" if target.met(value) else ""))
        bound = (">= " if target.at_least else "<= ") + target.fmt.format(target.bound)
        lines.append(f"| {target.measure} | {bound} | " + " | ".join(cells) + " |")
    return lines
