"""Several candidates per cell, verified losslessly: the tree of SJD-PAC's proactive drafting.

The first D - 1 cells past an image's last final token each get K candidates,
and every path through them is run in one pass as a K-ary tree: candidate b of
the cell at depth d sits under every node of depth d - 1. The all-zeros path is
the window's own chain (candidate 0 is the cell's current code); every other
node is a *side node*, run at a scratch cache slot past the image, at the
position of its depth, attending to its ancestors only.

A cell's candidates are drawn without replacement from its q (candidate 0 being
its current code, a sample of q), and checked in turn by recursive rejection
sampling: candidate b is accepted with probability min(1, p'(c) / q'(c)); after a
rejection p' becomes norm(max(0, p' - q')) and q' loses c and is renormalised.
If all are rejected the cell is drawn from the last p'. The result is a sample
of p, whatever q was (Jeon et al. 2024, recursive speculative decoding).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import torch

from ..sampling import RandomSource, residual, sample, uniform


@dataclass(frozen=True)
class CandidateTree:
    """K candidates (`width`) at each of `depth` - 1 cells past the root (SJD-PAC's tree_width and tree_depth)."""

    width: int
    depth: int

    def __post_init__(self) -> None:
        if self.width < 1 or self.depth < 1:
            raise ValueError(f"a candidate tree needs width >= 1 and depth >= 1, got {self.width}, {self.depth}.")

    @cached_property
    def side_paths(self) -> list[tuple[int, ...]]:
        """Branch paths (b_1..b_d) of the side nodes, shallow first: every path but the all-zeros chain."""
        return [
            path for d in range(1, self.depth) for path in itertools.product(range(self.width), repeat=d) if any(path)
        ]

    @property
    def num_side(self) -> int:
        return len(self.side_paths)

    @cached_property
    def side_depth(self) -> torch.Tensor:
        """Depth of each side node (1..D-1): its position past the root. [n_s]"""
        return torch.tensor([len(path) for path in self.side_paths], dtype=torch.long)

    def node(self, path: tuple[int, ...]) -> int:
        """A node of the tree: -1 - d for the chain node at depth d (the root is -1), else its side index."""
        return -1 - len(path) if not any(path) else self.side_paths.index(path)

    @cached_property
    def ancestry(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Which chain depths [n_s, D] and which side nodes [n_s, n_s] each side node sees (itself included)."""
        chain = torch.zeros(self.num_side, self.depth, dtype=torch.bool)
        side = torch.zeros(self.num_side, self.num_side, dtype=torch.bool)
        for j, path in enumerate(self.side_paths):
            for d in range(len(path) + 1):
                ancestor = self.node(path[:d])
                if ancestor < 0:
                    chain[j, -1 - ancestor] = True
                else:
                    side[j, ancestor] = True
            side[j, j] = True
        return chain, side

    @cached_property
    def children(self) -> torch.Tensor:
        """children[node + D, b]: the node under `node` (as `node` numbers it) taking candidate b. [D + n_s, K]"""
        nodes = [(0,) * d for d in range(self.depth - 1, -1, -1)] + self.side_paths  # chain D-1..0, then sides
        table = torch.zeros(len(nodes), self.width, dtype=torch.long)
        for row, path in enumerate(nodes):
            if len(path) < self.depth - 1:
                for b in range(self.width):
                    table[row, b] = self.node(path + (b,))
        return table

    def child(self, node: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """Nodes [B] (as `node` numbers them) and candidates [B] -> the child nodes [B]."""
        table = self.children.to(node.device)
        return table[node + self.depth, branch]


def draw_without_replacement(
    q: torch.Tensor, first: torch.Tensor, count: int, generator: RandomSource
) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` more codes per cell, drawn without replacement from q [..., K] and never equal to `first` [...].

    Gumbel top-k: the k largest of log q + Gumbel noise are a draw without replacement. Returns the codes
    [..., count] and whether each is a real draw [..., count] (q may have fewer codes of positive mass).
    """
    noise = -(-uniform(q.shape, generator, q.device).clamp_min(1e-20).log()).log()  # Gumbel(0, 1)
    keys = q.clamp_min(0).log() + noise
    keys.scatter_(-1, first[..., None], float("-inf"))
    top = keys.topk(count, dim=-1)
    return top.indices, top.values > float("-inf")


def recursive_rejection(
    candidates: torch.Tensor,
    real: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: RandomSource,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check candidates [B, K] (real [B, K]: drawn, not padding) in turn against p [B, K_codes] with proposal q.

    Returns the accepted candidate's index [B] (-1 if all were rejected) and the cell's code [B]: the
    accepted candidate, or a draw from the residual left after the last rejection.
    """
    p_left, q_left = p.clone(), q.clone()
    chosen = torch.full(candidates.shape[:1], -1, dtype=torch.long, device=candidates.device)
    u = uniform(candidates.shape, generator, candidates.device)
    for b in range(candidates.shape[1]):
        c = candidates[:, b : b + 1]
        open_ = (chosen < 0) & real[:, b]
        q_c, p_c = q_left.gather(-1, c).squeeze(-1), p_left.gather(-1, c).squeeze(-1)
        accepted = open_ & (u[:, b] * q_c < p_c)
        chosen = torch.where(accepted, b, chosen)
        rejected = (open_ & ~accepted)[:, None]
        p_left = torch.where(rejected, residual(p_left, q_left), p_left)
        q_without = q_left.scatter(-1, c, 0.0)
        q_without = q_without / q_without.sum(-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
        q_left = torch.where(rejected, q_without, q_left)
    drawn = sample(p_left, generator)
    codes = torch.where(chosen >= 0, candidates.gather(-1, chosen.clamp_min(0)[:, None]).squeeze(-1), drawn)
    return chosen, codes
