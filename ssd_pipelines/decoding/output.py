"""What a decoding call returns: the codes, each cell's final round, and the counts of the run.

Forward-pass counts are exact where timings on shared machines are noisy, so every strategy reports them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

UNDECODED = -1
"""Code, and final round, of a cell that was never decoded (the call was stopped before its row)."""


@dataclass
class DecodeStats:
    """Counts of one decoding run. Round k's lists hold cells verified / accepted in the k-th verification round;
    a round that no block ran has no entry."""

    strategy: str
    images: int
    chosen_decoding: str | None = None  # the strategy that decoded the grid: `strategy` itself, or what `auto` chose
    forward_passes: int = 0  # backbone passes, the prompt prefill included
    positions_processed: int = 0  # image positions each image ran through the backbone, summed over passes
    rows_completed: int = 0
    interrupted: bool = False  # stopped before the last row: rows from rows_completed on are UNDECODED
    # the most verifications a cell got, where a cap left the last round's resamples unchecked (ssd's
    # verify_rounds); None where checks go on until nothing changes (exact) or there are none (ar)
    round_cap: int | None = None
    drafted_per_round: list[int] = field(default_factory=list)
    accepted_per_round: list[int] = field(default_factory=list)
    seconds: float = 0.0
    # under `enable_compiled_passes`: calls of compiled passes and steps that ran compiled, that ran eagerly (their
    # backend failed; `warnings` says why), and the graphs compiled during this call (0 once warm)
    compiled_calls: int = 0
    eager_calls: int = 0
    graphs_compiled: int = 0

    @property
    def acceptance_per_round(self) -> list[float | None]:
        """Accepted / drafted per round; None for a round that verified no drafted cell."""
        return [a / d if d else None for a, d in zip(self.accepted_per_round, self.drafted_per_round)]

    def to_dict(self) -> dict:
        return {**asdict(self), "acceptance_per_round": self.acceptance_per_round}


@dataclass
class DecodeOutput:
    """The grid a call decoded. Rows from `stats.rows_completed` on hold `UNDECODED` in `codes` and `final_round`.

    final_round [B, R, C], per cell: 0 = sampled from the backbone's exact distribution (never drafted);
    1 = its first code (the head's draft), kept (accepted by every verification it met, or never verified
    when verify_rounds=0); k >= 2 = resampled in its (k - 1)-th verification and kept since (for `ssd`, the
    k-th verification of every cell is round k).
    """

    codes: torch.Tensor  # [B, R, C] image codes
    stats: DecodeStats
    final_round: torch.Tensor  # [B, R, C]
    hidden: torch.Tensor | None = None  # [B', R, C, d] pre-norm states predicting each cell, when recorded
    warnings: list[str] = field(default_factory=list)  # one sentence each: a fallback to eager, a recompile
