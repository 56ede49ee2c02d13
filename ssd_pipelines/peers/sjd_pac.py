"""SJD-PAC (Kang et al., CVPR 2026): SJD with adaptive continuation and proactive drafting. Lossless.

Follows `SJDPACSpeculativeSampler.__call__`, `generate_tree_mask_and_retrieve`
and `push_forward_model_kwargs_and_inputs` in
`scheduler/sjd_pac_iteration_lumina_mgpt.py` of KangJialiang/SJD-PAC, with its
defaults: 64 tokens per pass, tree width K = 3, depth D = 3.

- Adaptive continuation: after the first rejection the rest of the window is
  still judged, each cell against the p this pass gave it (stale, as its context
  just changed): accepted cells keep their code, rejected ones take the
  residual's, and all carry p as their next q (the `continue` tail of
  `window.py`, which is also `exact`'s rule).
- Proactive drafting: the first D - 1 cells past the last final token get K
  candidates each, run as a tree in the same pass (`candidate_tree.py`), so a
  rejection there can still be followed by an accepted alternative.
- Drafts enter the window as uniformly random codes with a uniform q.

What differs: the extra candidates are drawn without replacement from the cell's
q (the published code draws them from the residual and judges them as if drawn
from q; drawn from q the recursive check is exact by construction); when the
accepted path leaves the chain, the tokens it fixed are kept as final and re-run
by the next pass at their own cache slots instead of copying their cache entries
(SJD-PAC copies them in place), so `done` trails `final` by up to D - 1
positions; every image of a batch keeps its own frontier (the published code
runs batch 1); end-of-line tokens are forced, and sampling is the project's one
path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..decoding.run import DecodeRun
from .candidate_tree import CandidateTree, draw_without_replacement, recursive_rejection
from .sjd import random_codes
from .window import Judged, WindowDecoding, WindowRun


class SJDPACDecoding(WindowDecoding):
    """Lossless: random drafts, every cell of the window judged, K candidates for the first D - 1 cells."""

    name = "sjd-pac"  # its summary, lossless, needs_heads and options: catalog.py
    tail = "continue"

    def __init__(self, window: int = 64, tree_width: int = 3, tree_depth: int = 3):
        """window: tokens each pass runs per image, the tree's included (published: 64); tree_width, tree_depth:
        candidates per cell and the tree's depth, the last final token as its root (published: 3 and 3)."""
        super().__init__(window)
        self.tree = CandidateTree(tree_width, tree_depth)
        chain = window - self.tree.num_side
        if chain < 2 * tree_depth - 1:
            raise ValueError(
                f"window {window} leaves {chain} positions beside the tree's {self.tree.num_side} side nodes; it "
                f"needs at least {2 * tree_depth - 1}: widen the window or shrink the tree."
            )

    def _decode(self, run: DecodeRun) -> None:
        TreeWindowRun(run, self, self.window - self.tree.num_side).decode()

    def draft(self, front: WindowRun, images: torch.Tensor, cells: torch.Tensor) -> None:
        codebook = front.grid.codebook_size
        codes = random_codes(len(cells), codebook, front.run.generator, cells.device, images)
        front.set_drafts(images, cells, codes, torch.full((len(cells), codebook), 1.0 / codebook))


@dataclass
class TreeJudged(Judged):
    """A pass with a tree: also where each image's final token and committed cache now end, if the tree says."""

    tree_final: torch.Tensor | None = None  # [B] new final position, where the walk through the tree stopped
    tree_done: torch.Tensor | None = None  # [B] new `done` (the walk left the chain there)
    walked_on: torch.Tensor | None = None  # [B] the walk kept to the chain past the tree: the chain decides


class TreeWindowRun(WindowRun):
    """`WindowRun` with a candidate tree branching off at each image's last final token."""

    def __init__(self, run: DecodeRun, strategy: SJDPACDecoding, window: int):
        super().__init__(run, strategy, window)
        self.tree = strategy.tree

    def _judge(self, positions, cells, codes, ready) -> TreeJudged:
        run, tree, S = self.run, self.tree, self.grid.sequence_length
        images = self.images[:, None]
        K, D = tree.width, tree.depth
        # The tree's cells: depths 1..D-1 past `final`; candidate 0 is the cell's code, the others drawn from its q.
        depth_positions = self.final[:, None] + torch.arange(1, D, device=positions.device)  # [B, D - 1]
        depth_cells = self.cell_at[depth_positions.clamp_max(S)]
        depth_codes = torch.where(depth_cells >= 0, run.codes[images, depth_cells.clamp_min(0)], -1)
        q_depth = self.q_of(images, depth_cells)  # [B, D - 1, K_codes]
        extra, drawn = draw_without_replacement(q_depth, depth_codes.clamp_min(0), K - 1, run.generator)
        candidates = torch.cat([depth_codes.clamp_min(0)[..., None], extra], dim=-1)  # [B, D - 1, K]
        real = torch.cat([depth_codes[..., None] >= 0, drawn & (depth_cells[..., None] >= 0)], dim=-1)
        chain_out, side_out = self._forward_tree(positions, codes, cells, candidates, depth_cells)
        predicting = torch.cat([chain_out[:, :1], chain_out], dim=1)  # position i is predicted by output i - 1
        p = run.probs(predicting)  # [B, W + 1, K_codes]
        p_side = run.probs(side_out)  # [B, n_s, K_codes]: what follows each side node
        # The chain, judged whole (adaptive continuation); the tree then decides its own cells.
        todo = ready & (positions > self.final[:, None]) & (cells >= 0)
        fresh = todo & (codes < 0)
        judged, accepted = self.strategy.judge(self, codes.clamp_min(0), self.q_of(images, cells), p)
        new_codes = torch.where(fresh, run.sample(p), judged)
        accepted = accepted & ~fresh
        batch = self.images
        node = torch.full_like(batch, -1)  # the root: the last final token
        walking = torch.ones_like(batch, dtype=torch.bool)
        tree_final, left = self.final.clone(), torch.zeros_like(batch)
        for d in range(1, D):
            index = depth_positions[:, d - 1] - positions[:, 0]  # the cell's index in the window
            on_chain = node < 0
            p_here = torch.where(
                on_chain[:, None],
                p[batch, index.clamp(0, self.window)],
                p_side[batch, node.clamp_min(0)],
            )
            chosen, code = recursive_rejection(
                candidates[:, d - 1], real[:, d - 1], q_depth[:, d - 1], p_here, run.generator
            )
            is_eol = (depth_cells[:, d - 1] < 0) & (depth_positions[:, d - 1] < S)
            chosen = torch.where(is_eol, 0, chosen)  # a forced token
            over = depth_positions[:, d - 1] >= S
            take = walking & ~over & ~is_eol
            put = take & (index <= self.window)
            new_codes[batch[put], index[put]] = code[put]
            accepted[batch[put], index[put]] = chosen[put] >= 0
            tree_final = torch.where(walking, (depth_positions[:, d - 1]).clamp_max(S), tree_final)
            left = torch.where(walking & ~over & (chosen > 0) & (left == 0), d, left)
            node = torch.where(walking & ~over & (chosen >= 0), tree.child(node, chosen.clamp_min(0)), node)
            walking = walking & ~over & (chosen >= 0)
        # Past the tree: on the chain, the chain's own walk goes on; off it, the leaf's output gives a bonus cell.
        off_chain = walking & (node >= 0)
        bonus_position = self.final + D
        index = bonus_position - positions[:, 0]
        bonus = off_chain & (index <= self.window) & (self.cell_at[bonus_position.clamp_max(S)] >= 0)
        new_codes[batch[bonus], index[bonus]] = run.sample(p_side[batch, node.clamp_min(0)])[bonus]
        tree_final = torch.where(off_chain, bonus_position.clamp_max(S), tree_final)
        tree_done = torch.where(left > 0, self.final + left, tree_final)
        return TreeJudged(
            positions,
            cells,
            todo,
            todo & ~fresh,
            accepted,
            new_codes,
            p,
            predicting,
            tree_final=tree_final,
            tree_done=tree_done,
            walked_on=walking & (node < 0),
        )

    def _forward_tree(self, positions, codes, cells, candidates, depth_cells):
        """One pass: the chain's W positions, and the tree's side nodes at scratch slots past the image."""
        run, tree, S, W = self.run, self.tree, self.grid.sequence_length, self.window
        run.count_pass(W + tree.num_side)  # the chain and the tree's side nodes
        images = self.images[:, None]
        side_depth = tree.side_depth.to(positions.device)  # [n_s]
        side_branch = torch.tensor([path[-1] for path in tree.side_paths], device=positions.device)
        side_codes = candidates[images, side_depth - 1, side_branch]  # [B, n_s]
        side_cells = depth_cells[:, side_depth - 1]
        chain_positions = positions[:, :W]
        side_positions = self.final[:, None] + side_depth
        side_slots = (S + torch.arange(tree.num_side, device=positions.device)).expand_as(side_positions)
        slots = torch.arange(S + tree.num_side, device=positions.device)  # image slots, then one per side node
        chain_visible = slots <= chain_positions[..., None]  # [B, W, T]
        ancestors_chain, ancestors_side = (a.to(positions.device) for a in tree.ancestry)
        depth_slot = self.final[:, None] + torch.arange(tree.depth, device=positions.device)  # [B, D]
        image_part = slots[:S] <= self.final[:, None, None]  # [B, 1, S]: the prefix and the root
        image_part = image_part | ((slots[:S] == depth_slot[:, None, :, None]) & ancestors_chain[None, :, :, None]).any(
            dim=2
        )  # [B, n_s, S]: chain ancestors
        side_visible = torch.cat([image_part, ancestors_side[None].expand(len(images), -1, -1)], dim=-1)
        embeds = torch.cat(
            [run.embed_positions(codes[:, :W], cells[:, :W]), run.embed_positions(side_codes, side_cells)], dim=1
        )
        out = run.backbone.extend_at(
            self.state,
            embeds,
            self.both(torch.cat([chain_positions, side_positions], dim=1)),
            self.both(torch.cat([chain_visible, side_visible], dim=1)),
            slots=self.both(torch.cat([chain_positions, side_slots], dim=1)),
        )
        return out[:, :W], out[:, W:]

    def _settle(self, judged: TreeJudged) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the tree stopped, unless the walk stayed on the chain past it: then the chain's first stop."""
        beyond = judged.positions >= (self.final + self.tree.depth)[:, None]
        stops = judged.todo & ~judged.accepted & beyond
        first = torch.where(stops, torch.arange(self.window + 1, device=stops.device), self.window).amin(dim=1)
        chain_final = (judged.positions[:, 0] + first).clamp_max(self.grid.sequence_length)
        new_final = torch.where(judged.walked_on, chain_final, judged.tree_final)
        new_done = torch.where(judged.walked_on, chain_final, judged.tree_done)
        return new_final, new_done
