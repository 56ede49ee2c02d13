"""Drafted and accepted cells by verification round, summed on the device and read once at the end of a call.

Round k counts each cell's (k + 1)-th verification. Block `ssd` adds a whole round's counts at once (`add_round`);
the sliding-window engines add a pass's cells by how often each was checked before (`add`), by scatter, without
a host sync per pass.
"""

from __future__ import annotations

import torch

from .output import DecodeStats


class RoundCounter:
    def __init__(self, most_rounds: int, device: torch.device, state_full, real: torch.Tensor | None = None) -> None:
        """most_rounds: a bound on any cell's verifications (a frontier moves every pass: the passes' bound).
        state_full: the runner's `full`, which makes the state compiled steps write in place. real: which images
        [B] of a padded batch are real, the rows `add` counts (`batch_buckets`: a mask, so that the count of real
        images never enters a graph)."""
        self.real = real
        self.drafted = state_full("rounds.drafted", (most_rounds,), 0, torch.long, device)
        self.accepted = state_full("rounds.accepted", (most_rounds,), 0, torch.long, device)
        self.reached = 0  # rounds that `add_round` ran: they have an entry even when they verified no drafted cell

    def add_round(self, round_index: int, drafted: torch.Tensor, accepted: torch.Tensor) -> None:
        """One round of a block: how many drafted cells it verified and how many it kept (device scalars)."""
        self.drafted[round_index] += drafted
        self.accepted[round_index] += accepted
        self.reached = max(self.reached, round_index + 1)

    def add(self, checks_before: torch.Tensor, checked: torch.Tensor, accepted: torch.Tensor) -> None:
        """Cells of one pass: their earlier verifications, whether this pass checked them, whether it kept them."""
        if self.real is not None:
            checked = checked & self.real.view(-1, *(1,) * (checked.dim() - 1))
        index = checks_before.flatten().clamp(0, len(self.drafted) - 1)
        self.drafted.scatter_add_(0, index, checked.flatten().long())
        self.accepted.scatter_add_(0, index, (checked & accepted).flatten().long())

    def write_to(self, stats: DecodeStats) -> None:
        drafted, accepted = torch.stack([self.drafted, self.accepted]).tolist()  # read once, at the end
        # a cell checked k + 1 times was checked k times: the rounds that verified anything come first, no gaps
        rounds = max(self.reached, sum(d > 0 for d in drafted))
        stats.drafted_per_round, stats.accepted_per_round = drafted[:rounds], accepted[:rounds]
