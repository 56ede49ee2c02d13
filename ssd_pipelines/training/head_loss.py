"""The self-distillation objective: each head, from [h; e] at a cell, predicts h at its offset.

The paper's loss is a Smooth L1 between the predicted and the true hidden state.
What the verifier sees, though, is the distribution those states make through
the backbone's own final norm and output head, guided as at inference: q from
the prediction, p from the truth. Acceptance of a draft is 1 - TV(p, q), so the
losses here also compare the two distributions (docs/decoding.md, "Training
the heads"): KL(p || q), alone or beside the Smooth L1, or TV(p, q) itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..backbones.base import ImageBackbone
from ..heads import DraftHeads
from ..sampling import target_log_probs
from ..sampling_config import SamplingConfig
from .distill_data import DistillationData
from .teacher_forcing import draft_below_teacher_forced

LOSSES = ("smooth_l1", "kl", "kl+smooth_l1", "tv")


def head_offsets(heads: DraftHeads) -> list[tuple[str, tuple[int, int], nn.Module]]:
    """(name, (dy, dx), head) for every head: horizontal ones first, as in the loss vector."""
    right = [(f"horizontal_{dx}", (0, dx), head) for dx, head in enumerate(heads.horizontal, start=1)]
    below = [(f"vertical_{dy}", (dy, 0), head) for dy, head in enumerate(heads.vertical, start=1)]
    return right + below


def trained_offsets(heads: DraftHeads) -> list[tuple[str, tuple[int, int], nn.Module]]:
    """`head_offsets` less the heads frozen (no parameter requires a gradient): the ones a loss is computed for."""
    return [entry for entry in head_offsets(heads) if any(p.requires_grad for p in entry[2].parameters())]


def check_offsets(heads: DraftHeads, rows: int, cols: int) -> None:
    """Raise if a head's offset leaves the grid: it would have no cell to learn from."""
    for name, (dy, dx), _ in head_offsets(heads):
        if dy >= rows or dx >= cols:
            raise ValueError(f"head {name} has no target cell in a {rows}x{cols} grid: train fewer heads.")


def check_true_state_share(heads: DraftHeads, share: float) -> None:
    """Raise unless `share` is a share of cells and, if not 0, these heads read the state to a cell's left."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"true_state_share is a share of cells: pass a value in [0, 1], got {share}.")
    if share and not heads.reads_left_state:
        raise ValueError(
            "true_state_share is for a 'recurrent' drafter, which reads the state to a cell's left; these heads "
            f"have vertical_drafter={heads.drafter!r}: leave it at 0."
        )


class HeadLosses(nn.Module):
    """Every head's loss on a batch, as one module so DDP can wrap it (DraftHeads has no forward).

    loss: one of LOSSES. The distribution losses read the backbone's final norm and output head (frozen, not a
    submodule: DDP must not see them) and compare the distributions under `sampling`'s guidance and temperature.
    true_state_share: for a "recurrent" drafter, the share of cells (past the row's second) that read the true state
    to their left instead of the drafter's own output there, drawn afresh each batch: decoding on `exact`'s
    frontier gives it both.
    """

    def __init__(
        self,
        heads: DraftHeads,
        loss: str = "smooth_l1",
        backbone: ImageBackbone | None = None,
        sampling: SamplingConfig | None = None,
        true_state_share: float = 0.0,
    ):
        super().__init__()
        check_true_state_share(heads, true_state_share)
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}: choose one of {', '.join(LOSSES)}.")
        if loss != "smooth_l1" and (backbone is None or sampling is None):
            raise ValueError(f"loss {loss!r} compares distributions: pass the backbone and the sampling config.")
        self.heads, self.loss, self.backbone, self.sampling = heads, loss, backbone, sampling
        self.true_state_share = true_state_share
        self.backbone_dtype = None  # the dtype its output head computes in, read from a code's embedding
        if loss != "smooth_l1":
            code = torch.zeros(1, dtype=torch.long, device=backbone.device)
            self.backbone_dtype = backbone.embed_codes(code).dtype

    def forward(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """hidden [b, S, R, C, d], embeds [b, R, C, d_e] -> loss of each head not frozen [n_heads], over every cell
        with a target (order as in `trained_offsets`)."""
        rows, cols = hidden.shape[2:4]
        check_offsets(self.heads, rows, cols)
        embeds = embeds.unsqueeze(1).expand(-1, hidden.shape[1], -1, -1, -1)
        losses = []
        for name, (dy, dx), head in trained_offsets(self.heads):
            source = (slice(None), slice(None), slice(0, rows - dy), slice(0, cols - dx))
            target = (slice(None), slice(None), slice(dy, None), slice(dx, None))
            if dy:  # the vertical drafter, as it drafts: a row kind reads the row above around each cell, an
                # in-row one also the true codes to each cell's left, "recurrent" is unrolled along the row from the
                # true state predicting its first cell (or reads the true state to a cell's left, true_left)
                true_left = None
                if self.true_state_share:  # one draw per image, row and column, shared by the guidance branches
                    b, _, r, c = hidden[target].shape[:4]
                    true_left = torch.rand(b, 1, r, c, device=hidden.device) < self.true_state_share
                predicted = draft_below_teacher_forced(
                    self.heads, hidden[source], embeds[source], embeds[target], hidden[target], true_left, offset=dy
                )
            else:
                predicted = head(hidden[source], embeds[source])
            losses.append(self._compare(predicted, hidden[target]))
        return torch.stack(losses)

    def _compare(self, predicted: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
        """Mean over cells of the chosen loss between predicted and true states [b, S, ..., d]."""
        if self.loss == "smooth_l1":
            return F.smooth_l1_loss(predicted, true)
        with torch.no_grad():
            log_p = self._log_probs(true)
        log_q = self._log_probs(predicted)
        if self.loss == "tv":
            return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1).mean()
        p = log_p.exp()
        kl = torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1).mean()  # codes top-k cut from p add nothing
        return kl + F.smooth_l1_loss(predicted, true) if self.loss == "kl+smooth_l1" else kl

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """[b, S, ..., d] -> the guided log-distribution [b, ..., K] (branches stacked as the sampler takes them)."""
        logits = self.backbone.code_logits(hidden.transpose(0, 1).flatten(0, 1).to(self.backbone_dtype))
        return target_log_probs(logits, self.sampling)


@torch.no_grad()
def heldout_acceptance(
    heads: DraftHeads,
    backbone: ImageBackbone,
    data: DistillationData,
    sampling: SamplingConfig,
    batch_size: int = 16,
) -> dict[str, float]:
    """Each head's mean 1 - TV(p, q) over every cell of `data` with a target: the acceptance its drafts would get
    in a first verification if the context it reads were the true one (teacher-forced; the decoding benchmarks
    measure the real thing). What to compare trainings by without decoding."""
    objective = HeadLosses(heads, "tv", backbone, sampling)
    was_training = heads.training
    heads.eval()
    total = None
    for start in range(0, len(data), batch_size):
        _, per_head = batch_loss(objective, backbone, data[start : start + batch_size])
        part = per_head * min(batch_size, len(data) - start)
        total = part if total is None else total + part
    heads.train(was_training)
    names = [name for name, _, _ in trained_offsets(heads)]
    return {name: round(1 - value / len(data), 4) for name, value in zip(names, total.tolist())}


def distill_loss(
    heads: DraftHeads,
    backbone: ImageBackbone,
    batch: DistillationData,
    loss: str = "smooth_l1",
    sampling: SamplingConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the heads' losses, each head's loss [n_heads] detached); order as in `head_offsets`.

    Summed, not averaged: every head then gets exactly the gradient of its own loss.
    """
    return batch_loss(HeadLosses(heads, loss, backbone, sampling), backbone, batch)


def batch_loss(
    objective: nn.Module, backbone: ImageBackbone, batch: DistillationData
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss through `objective`: HeadLosses itself, or the DDP wrapper train_heads prepared around it."""
    weight = next(objective.parameters())
    with torch.no_grad():  # the backbone is only read: no gradient can reach it
        embeds = backbone.embed_codes(batch.codes.to(backbone.device, torch.long))
    hidden = batch.hidden.to(weight.device, weight.dtype)
    per_head = objective(hidden, embeds.to(weight.device, weight.dtype))
    return per_head.sum(), per_head.detach()
