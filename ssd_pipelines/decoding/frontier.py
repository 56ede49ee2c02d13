"""The sliding-window engine of `exact` and pipelined `ssd`: each image keeps its own frontier of final cells
(docs/decoding.md).

The frontier rule: in a pass, a cell whose left context was already final is
accepted or resampled against its true conditional, so it becomes final too.
Hence after every pass the prefix up to and including the first cell that
changed is final and never changes again. Nothing forces rows to move in
lockstep, so here every image of a batch has a frontier `done` (positions of the
image sequence committed to its KV cache; the token at `done` is final too), and
each pass runs the W positions from `done` on:

1. Verify. The pass gives the target p of every position after `done` up to
   and including the one just past the window. A drafted cell is accepted with
   probability min(1, p/q), else resampled from norm(max(0, p - q)); its q becomes
   p (the Jacobi rule: its code is now a sample of p). The first cell with no
   code yet is sampled from its p.
2. Advance. Positions before the first cell whose code changed hold final codes
   whose cache entries were computed from a final context: they are committed,
   and the changed cell (resampled against its true conditional) is final. With
   no change, the whole window is committed and the cell past it is final.
3. Re-propose (`exact` with an in-row drafter). A cell verified in the pass whose
   left codes the pass changed gets a q moved as the drafter predicts its target
   moves, and its code becomes a sample of that q by one accept/resample step.
4. Draft. Cells entering the window are drafted by the vertical heads from the
   cell above (its code, and the latest pass's hidden state there, final or
   not), in the first row by the horizontal heads from the rightmost cell that
   has been through a pass. A "row" drafter waits for codes in the row above's
   cells x - k..x + k, an "inrow" one also for those left of it in its own row,
   so its rows are drafted left to right over the bands ("recurrent" also reads
   the latest hidden state of the cell to its left, drafted or passed). A code's q is always
   the distribution it was drawn from, so every verification is a valid
   speculative step.

End-of-line tokens are forced, never drafted or verified. A cell verified before
the frontier reaches it arrives nearly converged, because its q is its last p.

With one generator per image (`sampling.ImageGenerators`), every pass draws a
window's noise per image, and drafts, flattened across images, say whose each
is: an image's draws follow its own frontier, so its codes do not depend on its
batch. A finished image idles at the end and still draws, but nothing of it
changes.
"""

from __future__ import annotations

import torch

from ..heads import DraftHeads
from ..sampling import reweighted, verify_round
from .base import UNDECODED, CheckCounter, DecodeRun, both_branches, cells_by_position


def committed_positions(changed: torch.Tensor) -> torch.Tensor:
    """Which cells of each window [B, W + 1] a pass changed -> how many of its W positions it commits [B]:
    those before the first change, all W when nothing changed (the position past the window is then final)."""
    last = changed.shape[1] - 1
    return torch.where(changed, torch.arange(last + 1, device=changed.device), last).amin(dim=1)


def check_window(window: int | None) -> None:
    """A window is None (one row) or a positive number of image positions."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive number of positions, got {window!r}.")


class FrontierRun:
    """The state of one `exact` call, or of a pipelined `ssd` one (a cap on each cell's verifications): per image a
    frontier, codes with their q, and the latest hidden states."""

    def __init__(
        self,
        run: DecodeRun,
        heads: DraftHeads,
        window: int,
        max_checks: int | None = None,
        horizontal: int | None = None,
        repropose: float = 0.0,
    ):
        """max_checks: None is lossless; k keeps a cell as it is after its k-th verification (pipelined `ssd`).
        horizontal: first-row cells the horizontal heads draft right of a passed cell (default: all they can).
        repropose: with an in-row drafter, the power of its predicted change that moves the q of a cell whose left
        codes a pass changed (`_repropose`); 0: off."""
        self.run, self.heads, self.grid = run, heads, run.grid
        self.max_checks = max_checks
        self.repropose = repropose if heads.in_row else 0.0
        self.horizontal = heads.max_horizontal if horizontal is None else horizontal
        grid, device = run.grid, run.codes.device
        self.window = min(window, grid.sequence_length)  # W
        self.cell_at = cells_by_position(grid, device)
        batch = run.prompts.batch_size
        self.done = torch.zeros(batch, dtype=torch.long, device=device)  # [B] committed positions
        self.ring = self.window + 1  # q of cell c lives in slot c % ring (cells past the frontier); one spare
        self.q: torch.Tensor | None = None  # [B, ring + 1, K]
        self.hidden: torch.Tensor | None = None  # [B', N, d]: latest hidden state predicting each cell
        self.passed = torch.zeros(batch, grid.num_cells, dtype=torch.bool, device=device)  # hidden from a pass
        self.verifications = torch.zeros(batch, grid.num_cells, dtype=torch.long, device=device)
        self.rounds = CheckCounter(grid.sequence_length + 2, device)  # at most 1 + S passes

    def decode(self) -> None:
        run, grid = self.run, self.grid
        self.state, h_first = run.prefill()  # [B', d]: the first cell's exact distribution
        p_first = run.probs(h_first)  # [B, K]
        self.q = p_first.new_zeros(run.prompts.batch_size, self.ring + 1, p_first.shape[-1])
        self.hidden = h_first.new_zeros(h_first.shape[0], grid.num_cells, run.backbone.hidden_size)
        run.codes[:, 0] = run.sample(p_first)
        run.final_round[:, 0] = 0
        self.hidden[:, 0] = h_first
        self.passed[:, 0] = True
        self._draft()
        while not run.stopped and bool((self.done < grid.sequence_length).any()):
            self._pass()
            self.run.frontier_reached(self.done)
        self.rounds.write_to(run.stats)

    def _pass(self) -> None:
        """One forward pass over each image's window: verify, advance the frontier, draft what enters."""
        run, grid, W = self.run, self.grid, self.window
        batch = torch.arange(self.done.shape[0], device=self.done.device)[:, None]
        starts = self.done.clamp_max(grid.sequence_length - W)  # [B]: finished rows idle at the end
        positions = starts[:, None] + torch.arange(W + 1, device=starts.device)  # [B, W + 1], the last one is past
        cells = self.cell_at[positions.clamp_max(grid.sequence_length)]  # [B, W + 1]
        codes = torch.where(cells >= 0, run.codes[batch, cells.clamp_min(0)], UNDECODED)
        has_token = (positions < grid.sequence_length) & ((cells < 0) | (codes >= 0))
        runs_in = has_token[:, :W].long().cumprod(dim=1).bool()  # [B, W]: the contiguous inputs
        ready = torch.cat([torch.ones_like(runs_in[:, :1]), runs_in], dim=1)  # [B, W + 1]: its p is valid
        # 1. Verify every cell past the frontier whose p is valid; sample the first cell without a code.
        embeds = run.embed_positions(codes[:, :W], cells[:, :W])
        out = run.backbone.extend_rows(self.state, embeds, both_branches(starts, run.prompts.guidance))
        run.stats.forward_passes += 1
        run.stats.positions_processed += W
        predicting = torch.cat([out[:, :1], out], dim=1)  # position i is predicted by output i - 1 (i >= 1)
        p = run.probs(predicting)  # [B, W + 1, K]; position 0 is final or committed, its p unused
        seen = ready & (positions > self.done[:, None]) & (cells >= 0)  # [B, W + 1]
        fresh = seen & (codes < 0)
        checked = seen & ~fresh
        if self.max_checks is not None:  # lossy: a cell verified max_checks times is kept as it is
            checked &= self.verifications[batch, cells.clamp_min(0)] < self.max_checks
        todo = fresh | checked
        q = self.q[batch, cells.clamp_min(0) % self.ring]
        verified, next_q, accepted = verify_round(codes.clamp_min(0), q, p, run.generator)
        new_codes = torch.where(fresh, run.sample(p), verified)
        next_q = torch.where(fresh[..., None], p, next_q)  # a fresh code was drawn from p
        self.rounds.add(self.verifications[batch, cells.clamp_min(0)], checked, accepted)
        changed = fresh | (checked & ~accepted)
        # 2. Advance: commit up to the first change; the changed cell (or the one past the window) is final.
        new_done = (starts + committed_positions(changed)).clamp_max(grid.sequence_length)
        exact = changed & (positions == new_done[:, None])  # drawn from its true conditional
        if self.repropose:
            # 3. Re-propose the cells whose left codes changed (past the frontier: checked again next pass).
            new_codes, next_q, moved = self._repropose(batch, cells, codes, todo, new_codes, next_q)
            changed = changed | moved
        self._store(cells, seen, todo, checked, changed, exact, new_codes, next_q, predicting)
        self.done = torch.maximum(self.done, new_done)
        self._draft()

    def _repropose(self, batch, cells, codes, todo, new_codes, next_q):
        """A cell this pass verified, whose left codes it also changed, is checked next against a target conditioned
        on the new codes, while its code is a sample of this pass's target p. The in-row drafter predicts how the
        target moves: q' = norm(p (q_d(new left) / q_d(old left)) ** power) (`sampling.reweighted`). One
        accept/resample step of the code against q' makes it a sample of q', its new q: the next check stays
        lossless, and accepts more often (docs/decoding.md, "Re-proposals"). Returns the codes, q and which moved."""
        run, heads, cols, W = self.run, self.heads, self.grid.cols, self.window
        steps = torch.arange(1, heads.config.left_codes + 1, device=cells.device)
        cell = cells.clamp_min(0)
        old_left = run.codes[batch[..., None], (cell[..., None] - steps).clamp_min(0)]  # [B, W + 1, L]: as passed
        index = torch.arange(W + 1, device=cells.device)[:, None] - steps  # [W + 1, L]: window index of x - j
        after = torch.where(todo, new_codes, codes)  # the window's codes once this pass is stored
        new_left = torch.where(index >= 0, after[batch[..., None], index.clamp_min(0)], old_left)
        on_row = (cell % cols)[..., None] - steps >= 0  # x - j in the same row: consecutive window positions
        which = todo & (cells >= cols) & ((old_left != new_left) & on_row).any(dim=-1)
        if not bool(which.any()):
            return new_codes, next_q, torch.zeros_like(which)
        b, c = batch.expand_as(cells)[which], cells[which]
        both_lefts = torch.cat([old_left[which], new_left[which]])  # one drafter call for both
        q_old, q_new = run.probs(self._row_draft(b.repeat(2), c.repeat(2), both_lefts)).chunk(2)
        target = reweighted(next_q[which], q_old, q_new, self.repropose)
        moved_codes, _, kept = verify_round(new_codes[which], next_q[which], target, run.generator, b)
        new_codes, next_q, moved = new_codes.clone(), next_q.clone(), torch.zeros_like(which)
        new_codes[which], next_q[which], moved[which] = moved_codes, target, ~kept
        return new_codes, next_q, moved

    def _store(self, cells, seen, todo, checked, changed, exact, new_codes, next_q, predicting) -> None:
        """Write back what the pass gave the cells it touched: codes, their next q, final rounds, and the hidden
        states of every cell it saw (a cell no longer verified still drafts the cell below it from its latest).

        Every window position writes, untouched ones their cell's current values, so nothing waits for the host
        to learn which were touched. Window positions hold distinct cells; end-of-line and past-the-end ones
        write to cell 0, which is final from the prefill and never touched, and to the q ring's spare slot."""
        run = self.run
        cell = cells.clamp_min(0)  # [B, W + 1]
        both_cell, both_seen = self._both(cell), self._both(seen)

        def put(target: torch.Tensor, index: torch.Tensor, values: torch.Tensor, where: torch.Tensor) -> None:
            """target[b, index[b, i]] = values[b, i] where `where`, else what it holds; trailing dims follow."""
            index = index.view(*index.shape, *(1,) * (target.dim() - 2)).expand(*index.shape, *target.shape[2:])
            where = where.view(*where.shape, *(1,) * (target.dim() - 2))
            target.scatter_(1, index, torch.where(where, values, target.gather(1, index)))

        put(run.codes, cell, new_codes, todo)
        put(self.q, torch.where(todo, cell % self.ring, self.ring), next_q, todo)
        put(self.hidden, both_cell, predicting.to(self.hidden.dtype), both_seen)
        put(self.passed, cell, torch.ones_like(seen), seen)
        # final_round: a new code drawn exactly is 0, a cell's first code 1, a code changed in check k shows k + 1
        k = self.verifications.gather(1, cell) + checked.long()
        put(self.verifications, cell, k, todo)
        since = torch.where(checked, k + 1, torch.where(exact, 0, 1))
        put(run.final_round, cell, since.to(run.final_round.dtype), changed)

    def _draft(self) -> None:
        """Give a code and q to every cell of each window that has none and can be drafted."""
        run, grid, W = self.run, self.grid, self.window
        batch = torch.arange(self.done.shape[0], device=self.done.device)[:, None]
        positions = self.done[:, None] + torch.arange(1, W + 1, device=self.done.device)
        cells = self.cell_at[positions.clamp_max(grid.sequence_length)]
        while True:  # a band of rows at a time: a cell needs a code in the cell it is drafted from
            missing = (cells >= 0) & (run.codes[batch, cells.clamp_min(0)] < 0)
            drafted = self._draft_below(batch, cells, missing & (cells >= grid.cols))
            drafted |= self._draft_right(batch, cells, missing & (cells < grid.cols))
            if not drafted:
                return

    def _draft_below(self, batch, cells, missing) -> bool:
        """Vertical heads: each missing cell from the cell above it, if that one has a code. Drafted any?"""
        if self.heads.drafter != "cell":
            return self._draft_below_from_row(batch, cells, missing)
        run = self.run
        above = (cells - self.grid.cols).clamp_min(0)
        can = missing & (run.codes[batch, above] >= 0)
        if not bool(can.any()):
            return False
        b, c, a = batch.expand_as(cells)[can], cells[can], above[can]
        h = self.hidden[self._branch_rows(b), self._both(a)]  # [B' / B * n, d]
        e = run.embed_codes(run.codes[b, a])
        drafted = self.heads.draft_below(h[:, None], e[:, None], 1)[:, 0, 0]  # [B' / B * n, d]
        self._take_drafts(b, c, drafted)
        return True

    def _draft_below_from_row(self, batch, cells, missing) -> bool:
        """A "row" / "inrow" drafter: each missing cell from the row above's cells x - k..x + k (k = row_kernel // 2),
        once those that lie on the row have codes; "inrow" also from the codes at x - 1..x - left_codes of its own
        row, once those have codes, so that a row is drafted left to right over the loop's bands. Drafted any?"""
        run, heads, cols = self.run, self.heads, self.grid.cols
        device = cells.device
        cell = cells.clamp_min(0)
        column = cell % cols  # [B, W]
        half = heads.config.row_kernel // 2
        near_columns = column[..., None] + torch.arange(-half, half + 1, device=device)  # [B, W, kernel]
        near_on = (near_columns >= 0) & (near_columns < cols)
        near = (cell // cols - 1).clamp_min(0)[..., None] * cols + near_columns.clamp(0, cols - 1)  # row above
        near_codes = run.codes[batch[..., None], near]
        can = missing & ((near_codes >= 0) | ~near_on).all(dim=-1)
        if heads.in_row:
            steps = torch.arange(1, heads.config.left_codes + 1, device=device)
            left_on = column[..., None] - steps >= 0  # [B, W, L]: x - j on the row
            left_codes = run.codes[batch[..., None], (cell[..., None] - steps).clamp_min(0)]
            can &= ((left_codes >= 0) | ~left_on).all(dim=-1)
        if not bool(can.any()):
            return False
        b, c = batch.expand_as(cells)[can], cells[can]
        self._take_drafts(b, c, self._row_draft(b, c))
        return True

    def _row_draft(self, b: torch.Tensor, c: torch.Tensor, left_codes: torch.Tensor | None = None) -> torch.Tensor:
        """The row drafter's hidden state [B' / B * n, d] for cells (b, c) [n] of rows >= 1: from the row above's
        codes and latest states at x - k..x + k (zero padding off the row); the in-row kinds also from the codes at
        x - 1..x - left_codes, left_codes [n, L] (default: the codes there now; start vectors off the row);
        "recurrent" also from the latest state predicting the cell to the left (zeros at x = 0)."""
        run, heads, cols = self.run, self.heads, self.grid.cols
        column = c % cols
        half = heads.config.row_kernel // 2
        near_columns = column[:, None] + torch.arange(-half, half + 1, device=c.device)  # [n, kernel]
        near = (c // cols - 1)[:, None] * cols + near_columns.clamp(0, cols - 1)
        on = self._both((near_columns >= 0) & (near_columns < cols))[..., None]  # [B' / B * n, kernel, 1]
        h = self.hidden[self._branch_rows(b)[:, None], self._both(near)]  # [B' / B * n, kernel, d]
        e = run.embed_codes(run.codes[b[:, None], near].clamp_min(0))
        context = heads.row_context_at(torch.where(on, h, 0), torch.where(on, e, 0))
        left = state = None
        if heads.in_row:
            steps = torch.arange(1, heads.config.left_codes + 1, device=c.device)
            if left_codes is None:
                left_codes = run.codes[b[:, None], (c[:, None] - steps).clamp_min(0)]
            off_row = self._both(column[:, None] - steps < 0)
            left = heads.start_embeds(run.embed_codes(left_codes.clamp_min(0)), off_row)
        if heads.reads_left_state:
            state = self.hidden[self._branch_rows(b), self._both(c - 1).clamp_min(0)]
            state = torch.where(self._both(column > 0)[:, None], state, 0)
        return heads.draft_step(context, left, state).to(h.dtype)

    def _draft_right(self, batch, cells, missing) -> bool:
        """First row: horizontal heads from the rightmost cell that has been through a pass. Drafted any?"""
        run, cols = self.run, self.grid.cols
        passed_cols = torch.where(self.passed[:, :cols], torch.arange(cols, device=cells.device), -1)
        base = passed_cols.amax(dim=1, keepdim=True).expand_as(cells)  # [B, W]
        offset = cells - base
        can = missing & (offset >= 1) & (offset <= self.horizontal)
        if not bool(can.any()):
            return False
        b, c, src = batch.expand_as(cells)[can], cells[can], base[can]
        h = self.hidden[self._branch_rows(b), self._both(src)]
        e = run.embed_codes(run.codes[b, src])
        every = self.heads.draft_right(h, e, self.horizontal)  # [B' / B * n, k_h, d]
        drafted = every[torch.arange(every.shape[0], device=every.device), self._both(offset[can]) - 1]
        self._take_drafts(b, c, drafted)
        return True

    def _both(self, x: torch.Tensor) -> torch.Tensor:
        return both_branches(x, self.run.prompts.guidance)

    def _branch_rows(self, images: torch.Tensor) -> torch.Tensor:
        """Images [n] -> their rows in every guidance branch [B' / B * n] (conditional rows, then unconditional)."""
        return torch.cat([images, images + self.run.prompts.batch_size]) if self.run.prompts.guidance else images

    def _take_drafts(self, b: torch.Tensor, c: torch.Tensor, drafted: torch.Tensor) -> None:
        """Drafted hidden states [B' / B * n, d] of cells (b, c): sample codes; keep q, and the draft as hidden."""
        run = self.run
        q = run.probs(drafted)  # [n, K]
        run.codes[b, c] = run.sample(q, b)  # with one generator per image, each draws its own cells, in window order
        self.q[b, c % self.ring] = q
        self.hidden[self._branch_rows(b), self._both(c)] = drafted.to(self.hidden.dtype)
        run.final_round[b, c] = 1
