"""Speculative decoding over a 1D window past each image's frontier: what `sjd`, `sjd-pac`, `gsd` and `mtp1d` share.

Every image keeps two pointers into its image sequence (end-of-line tokens
included): `final`, the last position whose token is final, and `done` <= final,
the positions whose cache entries were computed from final tokens (they differ
only after a tree, see `sjd_pac.py`). Each forward pass runs, per image, W
positions from `done` (clamped to the sequence end) at that image's own cache
slots (`extend_at`), and so gets the target p of every position past `final` up
to the one just past the window. Then:

1. Judge. Every drafted cell past `final` is accepted or not by the strategy's
   rule (min(1, p/q), or GSD's grouped rule); a rejected one gets a new code
   from norm(max(0, p - q)).
2. Commit. Walking right from `final`, accepted cells and forced end-of-line
   tokens stay; the first cell that was rejected, or has no draft, takes its new
   code (the residual's, or a draw from p), which is final because its context
   was. If nothing stops the walk, everything up to the position past the
   window is final.
3. Tail. Cells past that point were judged in a context that has just changed;
   the strategy says what becomes of them: drawn again from their p (SJD's
   Jacobi step), kept as this pass judged them (SJD-PAC's adaptive
   continuation), or dropped (mtp1d's rollback). A kept code is a sample of this
   pass's p, so p is its next q.
4. Draft the cells that enter the next window.

Images of a batch advance independently; the statistics count, as `exact`
does, every cell's k-th verification as round k.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import torch

from ..decoding.output import UNDECODED
from ..decoding.run import DecodeRun
from ..decoding.sliding import Progress, SlidingWindow
from ..decoding.strategy import DecodingStrategy
from ..sampling import verify_round

TAILS = ("resample", "continue", "drop")


class WindowDecoding(DecodingStrategy):
    """A strategy over `WindowRun`: it names its window and tail rule, drafts cells, and may judge differently."""

    tail: str  # one of TAILS
    needs_hidden = False  # whether `draft` reads `WindowRun.h_final`

    def __init__(self, window: int):
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise ValueError(f"window must be an integer >= 2 (the frontier token and a draft), got {window!r}.")
        self.window = window  # tokens each pass runs per image

    def _decode(self, run: DecodeRun) -> None:
        WindowRun(run, self, self.window).decode()

    @abstractmethod
    def draft(self, front: WindowRun, images: torch.Tensor, cells: torch.Tensor) -> None:
        """Give codes and their q (`front.set_drafts`) to cells [n] of images [n], past the frontier."""

    def judge(self, front: WindowRun, codes, q, p) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafted codes [B, n] with their q and target p [B, n, K] -> (code after the check, accepted) [B, n]."""
        verified, _, accepted = verify_round(codes, q, p, front.run.generator)
        return verified, accepted


@dataclass
class Judged:
    """What one pass found, per image and window position [B, W + 1] (the last position is past the window)."""

    positions: torch.Tensor
    cells: torch.Tensor
    todo: torch.Tensor  # cells past `final` whose p is valid
    checked: torch.Tensor  # ... that held a draft
    accepted: torch.Tensor
    codes: torch.Tensor  # every cell's code after the pass (a fresh cell's drawn from p)
    p: torch.Tensor  # [B, W + 1, K]
    predicting: torch.Tensor  # [B', W + 1, d]: hidden state predicting each position (index 0 unused)


class WindowRun(SlidingWindow):
    """The state of one call of a `WindowDecoding`: per image two pointers, codes past them with their q."""

    def __init__(self, run: DecodeRun, strategy: WindowDecoding, window: int):
        super().__init__(run, window)
        self.strategy = strategy
        batch = run.prompts.batch_size
        self.final = torch.zeros(batch, dtype=torch.long, device=self.done.device)  # [B] last final position
        self.ring = 2 * self.window + 1  # q of cell c lives in slot c % ring: only cells past `final` need one
        self.q: torch.Tensor | None = None  # [B, ring, K]
        self.h_final: torch.Tensor | None = None  # [B', d]: hidden state predicting the token at `final`
        self.memo: dict = {}  # what a strategy computes once per call (it holds only settings itself)

    def q_of(self, images: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        return self.q[images, cells.clamp_min(0) % self.ring]

    def set_drafts(self, images: torch.Tensor, cells: torch.Tensor, codes: torch.Tensor, q: torch.Tensor) -> None:
        """Store drafted codes [n] with the q [n, K] they were drawn from."""
        self.run.codes[images, cells] = codes
        self.q[images, cells % self.ring] = q.to(self.q.dtype)
        self.run.final_round[images, cells] = 1

    def start(self) -> None:
        run = self.run
        self.state, h_first = run.prefill()  # [B', d]: the first cell's exact distribution
        p_first = run.probs(h_first)  # [B, K]
        self.q = p_first.new_zeros(run.prompts.batch_size, self.ring, p_first.shape[-1])
        run.codes[:, 0] = run.sample(p_first)
        run.final_round[:, 0] = 0
        self.h_final = h_first

    def last_final(self) -> torch.Tensor:
        return self.final

    def step(self, progress: Progress) -> None:
        self._draft()
        self._pass()

    def _pass(self) -> None:
        """One forward pass: judge, commit, settle the tail, draft."""
        window = self.place()
        judged = self._judge(window.positions, window.cells, window.codes, window.ready)
        new_final, new_done = self._settle(judged)
        self._store(judged, new_final)
        if self.strategy.needs_hidden:
            index = (new_final - judged.positions[:, 0]).clamp(0, self.window)  # the new final's window index
            rows = self.both(index)[:, None, None].expand(-1, 1, judged.predicting.shape[-1])
            self.h_final = judged.predicting.gather(1, rows)[:, 0]
        self.final, self.done = new_final, new_done

    def _judge(self, positions, cells, codes, ready) -> Judged:
        """Run the window and judge every drafted cell past `final`; draw a code for every cell without one."""
        run, W = self.run, self.window
        out = self._forward(positions[:, :W], codes[:, :W], cells[:, :W])
        predicting = torch.cat([out[:, :1], out], dim=1)  # position i is predicted by output i - 1 (i >= 1)
        p = run.probs(predicting)  # [B, W + 1, K]
        todo = ready & (positions > self.final[:, None]) & (cells >= 0)
        fresh = todo & (codes < 0)
        judged, accepted = self.strategy.judge(self, codes.clamp_min(0), self.q_of(self.images[:, None], cells), p)
        new_codes = torch.where(fresh, run.sample(p), judged)
        return Judged(positions, cells, todo, todo & ~fresh, accepted & ~fresh, new_codes, p, predicting)

    def _forward(self, positions: torch.Tensor, codes: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """One pass over W positions per image [B, W] -> hidden states [B', W, d]."""
        run = self.run
        run.count_pass(positions.shape[1])
        slots = torch.arange(self.grid.sequence_length, device=positions.device)
        positions = self.both(positions)
        return run.backbone.extend_at(
            self.state, run.embed_positions(codes, cells), positions, slots <= positions[..., None]
        )

    def _settle(self, judged: Judged) -> tuple[torch.Tensor, torch.Tensor]:
        """The new `final` and `done` [B]: the first stop (a rejected or fresh cell), or past the window."""
        stops = judged.todo & ~judged.accepted
        first = torch.where(stops, torch.arange(self.window + 1, device=stops.device), self.window).amin(dim=1)
        new_final = (judged.positions[:, 0] + first).clamp_max(self.grid.sequence_length)
        return new_final, new_final

    def _store(self, judged: Judged, new_final: torch.Tensor) -> None:
        """Write back codes, their next q, the final rounds and the counts, by where each cell stands."""
        run, rule = self.run, self.strategy.tail
        positions, cells, todo, checked = judged.positions, judged.cells, judged.todo, judged.checked
        final = new_final[:, None]
        tail = positions > final
        counted = checked & ((positions <= final) | (rule == "continue"))
        self.rounds.add(self.verifications[self.images[:, None], cells.clamp_min(0)], counted, judged.accepted)
        if rule == "drop":
            b, i = (tail & (cells >= 0)).nonzero(as_tuple=True)
            run.codes[b, cells[b, i]] = UNDECODED
            run.final_round[b, cells[b, i]] = UNDECODED
            todo = todo & ~tail
        codes = judged.codes
        if rule == "resample":
            codes = torch.where(tail, run.sample(judged.p), codes)
        b, i = todo.nonzero(as_tuple=True)
        c = cells[b, i]
        changed = codes[b, i] != run.codes[b, c]
        run.codes[b, c] = codes[b, i]
        self.q[b, c % self.ring] = judged.p[b, i]  # every kept code is a sample of this pass's p
        k = self.verifications[b, c] + counted[b, i].long()
        self.verifications[b, c] = k
        # final_round: drawn at the stop from its true conditional 0; changed in check k, k + 1; drawn again 1
        since = torch.where(positions[b, i] == new_final[b], 0, torch.where(counted[b, i], k + 1, 1))
        run.final_round[b, c] = torch.where(changed, since, run.final_round[b, c])

    def _draft(self) -> None:
        """Draft every cell of each next window that is past `final` and has no code."""
        S, W = self.grid.sequence_length, self.window
        positions = self.starts[:, None] + torch.arange(W, device=self.done.device)  # [B, W]
        cells = self.cell_at[positions.clamp_max(S)]
        images = self.images[:, None].expand_as(cells)
        missing = (cells >= 0) & (positions > self.final[:, None])
        missing &= self.run.codes[images, cells.clamp_min(0)] < 0
        if bool(missing.any()):
            self.strategy.draft(self, images[missing], cells[missing])
