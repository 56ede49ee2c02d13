"""Grouped Speculative Decoding (So et al., ICCV 2025): SJD whose drafts are judged by groups of codes. Lossy.

Follows `SpeculativeSampler.__call__` in `scheduler/jacobi_iteration_lumina_mgpt.py`
of junhyukso/GSD (its `jacobi_iteration_lumina_mgpt_sjd.py` is plain SJD). Image
codes are redundant: many convey nearly the same patch, so rejecting a draft
because the target prefers its neighbour is a false negative. A draft x is
accepted with probability min(1, p(G) / q(G)) over its group G, the codes next to
x in the target's ranking (7 ranks below, 6 above, as published) whose target
probability is within 0.15 of p(x) and whose input embedding is near x's. A
rejected draft is resampled from norm(max(0, p - q)); everything else is SJD
(`sjd.py`), window 16, random drafts.

What differs: the published embedding filter is a squared distance below 0.5
in Lumina-mGPT's embedding space; no absolute distance carries over to another
model, so here "near" is a quantile of the squared distances between the
backbone's code embeddings (default: the closest quarter of code pairs). A draft
whose rank is below 7 is judged over the ranks that exist (the published slice
is then empty and the draft always rejected).
"""

from __future__ import annotations

import torch

from ..sampling import residual, sample, uniform
from .sjd import SJDDecoding
from .window import WindowRun

RANKS_BELOW, RANKS_ABOVE = 7, 6  # the published group: ranks [r - 7, r + 7) around the draft's rank r
PROBABILITY_GAP = 0.15  # a group member's target probability is within this of the draft's


def group_mass(tokens, q, p, embeddings, radius: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft mass of each draft's group: tokens [B, n], q and p [B, n, K], embeddings [K, d_e].

    Returns (p(G), q(G)) [B, n]. The draft always belongs to its own group.
    """
    codebook = p.shape[-1]
    order = p.argsort(dim=-1, stable=True)  # [B, n, K], ascending target probability
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(codebook, device=p.device).expand_as(order))
    offsets = torch.arange(-RANKS_BELOW, RANKS_ABOVE + 1, device=p.device)  # [G]
    ranks = rank.gather(-1, tokens[..., None]) + offsets  # [B, n, G]
    inside = (ranks >= 0) & (ranks < codebook)
    group = order.gather(-1, ranks.clamp(0, codebook - 1))  # [B, n, G] codes
    p_group, q_group = p.gather(-1, group), q.gather(-1, group)
    p_token = p.gather(-1, tokens[..., None])
    distance = (embeddings[group] - embeddings[tokens][..., None, :]).pow(2).sum(-1)  # [B, n, G]
    member = inside & ((p_group - p_token).abs() < PROBABILITY_GAP) & (distance <= radius)
    return (p_group * member).sum(-1), (q_group * member).sum(-1)


def embedding_radius(embeddings: torch.Tensor, quantile: float, most: int = 1024) -> float:
    """The `quantile` of squared distances between code embeddings [K, d_e] (the first `most` codes)."""
    some = embeddings[:most].float()
    distances = torch.cdist(some, some).pow(2)
    pairs = distances[~torch.eye(len(some), dtype=torch.bool, device=some.device)]
    return float(torch.quantile(pairs[:1_000_000], quantile))


class GSDDecoding(SJDDecoding):
    """SJD with grouped acceptance: more drafts kept, the AR distribution given up."""

    name = "gsd"  # its summary, lossless, needs_heads and options: catalog.py

    def __init__(self, window: int = 16, neighbour_quantile: float = 0.25):
        """neighbour_quantile: codes closer than this quantile of code-pair embedding distances are neighbours."""
        super().__init__(window)
        if not 0.0 < neighbour_quantile <= 1.0:
            raise ValueError(f"neighbour_quantile must lie in (0, 1], got {neighbour_quantile}.")
        self.neighbour_quantile = neighbour_quantile

    def judge(self, front: WindowRun, codes, q, p) -> tuple[torch.Tensor, torch.Tensor]:
        if "embeddings" not in front.memo:  # once per call: the codebook's input embeddings and the radius
            backbone = front.run.backbone
            embeddings = backbone.embed_codes(torch.arange(front.grid.codebook_size, device=codes.device)).float()
            front.memo["embeddings"] = embeddings
            front.memo["radius"] = embedding_radius(embeddings, self.neighbour_quantile)
        p_mass, q_mass = group_mass(codes, q, p, front.memo["embeddings"], front.memo["radius"])
        accepted = uniform(codes.shape, front.run.generator, codes.device) * q_mass < p_mass
        resampled = sample(residual(p, q), front.run.generator)
        return torch.where(accepted, codes, resampled), accepted
