"""The sliding-window engine of `exact` and pipelined `ssd`: each image keeps its own frontier of final cells
(docs/decoding.md).

The frontier rule: in a pass, a cell whose left context was already final is
accepted or resampled against its true conditional, so it becomes final too.
Hence after every pass the prefix up to and including the first cell that
changed is final and never changes again. Nothing forces rows to move in
lockstep, so here every image of a batch has a frontier `done` (positions of the
image sequence committed to its KV cache; the token at `done` is final too), and
each pass runs the W positions from `done` on:

1. Draft. Every cell of the window that has no code gets one, in raster order,
   so that whatever a draft reads is there before it: in the first row from the
   horizontal heads, right of the rightmost cell that has been through a pass;
   below it from the vertical drafter, which reads the row above around the
   cell (its code, and the latest pass's hidden state there, final or not) and,
   for the in-row kinds, the codes drawn to its left ("recurrent": also the
   latest state predicting the cell to its left, drafted or passed). A code's q
   is always the distribution it was drawn from, so every verification is a
   valid speculative step.
2. Verify. The pass gives the target p of every position after `done` up to
   and including the one just past the window. A drafted cell is accepted with
   probability min(1, p/q), else resampled from norm(max(0, p - q)); its q becomes
   p (the Jacobi rule: its code is now a sample of p). The first cell with no
   code yet is sampled from its p.
3. Advance. Positions before the first cell whose code changed hold final codes
   whose cache entries were computed from a final context: they are committed,
   and the changed cell (resampled against its true conditional) is final. With
   no change, the whole window is committed and the cell past it is final.
4. Re-propose (`exact` with an in-row drafter). A cell verified in the pass whose
   left codes the pass changed gets a q moved as the drafter predicts its target
   moves, and its code becomes a sample of that q by one accept/resample step.

End-of-line tokens are forced, never drafted or verified. A cell verified before
the frontier reaches it arrives nearly converged, because its q is its last p.

Written as a GPU runs it: every step works on the whole window of every image,
masked, so that shapes do not follow the data, and the only read of the host is
the loop's one per pass (`sliding.Progress`), which also says how many cells the
images draft. Each pass reads one row of a `NoiseTape`: image b's noise comes
from its own generator in a fixed layout, so its codes do not depend on its
batch. A finished image idles at the end and still reads its tape, but nothing
of it changes.
"""

from __future__ import annotations

import torch

from ..heads import DraftHeads
from ..sampling import reweighted, sample_with, verify_with
from .run import DecodeRun
from .sliding import Progress, SlidingWindow, Window


def committed_positions(changed: torch.Tensor) -> torch.Tensor:
    """Which cells of each window [B, W + 1] a pass changed -> how many of its W positions it commits [B]:
    those before the first change, all W when nothing changed (the position past the window is then final)."""
    last = changed.shape[1] - 1
    return torch.where(changed, torch.arange(last + 1, device=changed.device), last).amin(dim=1)


def scatter_where(target: torch.Tensor, index: torch.Tensor, values: torch.Tensor, where: torch.Tensor) -> None:
    """target[b, index[b, i]] = values[b, i] where `where`, else what it holds; trailing dims follow. Indices of one
    row must be distinct, except where `where` is False and the target is not written elsewhere."""
    index = index.view(*index.shape, *(1,) * (target.dim() - 2)).expand(*index.shape, *target.shape[2:])
    where = where.view(*where.shape, *(1,) * (target.dim() - 2))
    target.scatter_(1, index, torch.where(where, values, target.gather(1, index)))


class FrontierRun(SlidingWindow):
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
        super().__init__(run, window)
        self.heads, self.drafter = heads, heads.vertical
        self.max_checks = max_checks
        self.repropose = repropose if self.drafter.left_codes else 0.0
        self.horizontal = heads.max_horizontal if horizontal is None else horizontal
        grid, device, W = run.grid, run.codes.device, self.window
        # Drafts of a parallel drafter wait on the row above only: a chain of them spans the window's rows.
        span = max(grid.row_length - self.drafter.reach, 1)
        self.draft_steps = 1 + (W - 1) // span
        self.ring = W + 1  # q of cell c lives in slot c % ring (cells past the frontier); one spare
        self.q: torch.Tensor | None = None  # [B, ring + 1, K]
        self.hidden: torch.Tensor | None = None  # [B', N, d]: latest hidden state predicting each cell
        batch = run.prompts.batch_size
        full = run.runner.full  # state the compiled steps write in place
        self.passed = full("frontier.passed", (batch, grid.num_cells), False, torch.bool, device)  # hidden from a pass
        # A pass's noise: acceptance, residual and fresh draws and two for re-proposals at each of its W + 1
        # positions, then one for each cell drafted before it.
        self.noise = run.noise_tape(5 * (W + 1) + W)

    @property
    def compile_key(self) -> tuple:
        """What of this run's Python state its compiled steps read (`compiled.signature`)."""
        settings = (self.window, self.max_checks, self.repropose, self.horizontal, self.draft_steps, self.ring)
        return type(self).__name__, self.run.compile_key, settings, id(self.heads)

    can_read_late = True

    def ahead(self, known: Progress) -> Progress:
        """A pass moves a frontier by at most W positions, so the next pass attends at most W further than `known`
        says; an image drafts at most its window, and drafting more steps, or from the first row, than it needs
        changes nothing (each step drafts what is valid and missing). `done` and `final` only grow: the callback
        and the stop rule learn a pass late."""
        furthest = min(known.furthest + self.window, self.grid.sequence_length)
        return Progress(known.done, known.final, furthest, self.window)

    def start(self) -> None:
        run, grid = self.run, self.grid
        self.state, h_first = run.prefill()  # [B', d]: the first cell's exact distribution
        p_first = run.probs(h_first)  # [B, K]
        full, device = run.runner.full, p_first.device
        self.q = full(
            "frontier.q", (run.prompts.batch_size, self.ring + 1, p_first.shape[-1]), 0, p_first.dtype, device
        )
        self.hidden = full(
            "frontier.hidden", (h_first.shape[0], grid.num_cells, run.backbone.hidden_size), 0, h_first.dtype, device
        )
        run.codes[:, 0] = sample_with(p_first, self.noise.next()[:, 0])
        run.final_round[:, 0] = 0
        self.hidden[:, 0] = h_first
        self.passed[:, 0] = True

    def step(self, progress: Progress) -> None:
        noise = self.noise.next()
        W1 = self.window + 1
        self._draft(progress, noise[:, 5 * W1 :])
        self._pass(progress, noise[:, : 5 * W1].unflatten(1, (5, W1)).unbind(1))

    def _pass(self, progress: Progress, noise: tuple[torch.Tensor, ...]) -> None:
        """One forward pass over each image's window, then what it decides (`_verify`)."""
        run, W = self.run, self.window
        window = self.place()
        embeds = run.embed_positions(window.codes[:, :W], window.cells[:, :W])
        out = run.backbone.extend_rows(self.state, embeds, self.both(window.positions[:, 0]), self.attended(progress))
        run.count_pass(W)
        run.runner.step(FrontierRun._verify, "the verification step")(self, window, out, noise)

    def _verify(self, window: Window, out: torch.Tensor, noise: tuple[torch.Tensor, ...]) -> None:
        """What a pass's outputs [B', W, d] decide: verify, advance the frontier, re-propose. One step of tensors
        without a read of the host, compiled with the passes."""
        run, grid = self.run, self.grid
        accept_noise, residual_noise, fresh_noise, *repropose_noise = noise  # [B, W + 1] each
        positions, cells, codes = window.positions, window.cells, window.codes
        starts = positions[:, 0]
        predicting = torch.cat([out[:, :1], out], dim=1)  # position i is predicted by output i - 1 (i >= 1)
        p = run.probs(predicting)  # [B, W + 1, K]; position 0 is final or committed, its p unused
        # 2. Verify every cell past the frontier whose p is valid; sample the first cell without a code.
        cell = cells.clamp_min(0)
        seen = window.ready & (positions > self.done[:, None]) & (cells >= 0)  # [B, W + 1]
        fresh = seen & (codes < 0)
        checked = seen & ~fresh
        if self.max_checks is not None:  # lossy: a cell verified max_checks times is kept as it is
            checked &= self.verifications.gather(1, cell) < self.max_checks
        todo = fresh | checked
        q = self.q.gather(1, (cell % self.ring)[..., None].expand(-1, -1, self.q.shape[-1]))
        codes = codes.clamp_min(0)
        verified, next_q, accepted = verify_with(codes, q, p, accept_noise, residual_noise)
        new_codes = torch.where(fresh, sample_with(p, fresh_noise), verified)
        next_q = torch.where(fresh[..., None], p, next_q)  # a fresh code was drawn from p
        self.rounds.add(self.verifications.gather(1, cell), checked, accepted)
        changed = fresh | (checked & ~accepted)
        # 3. Advance: commit up to the first change; the changed cell (or the one past the window) is final.
        new_done = (starts + committed_positions(changed)).clamp_max(grid.sequence_length)
        exact = changed & (positions == new_done[:, None])  # drawn from its true conditional
        if self.repropose:
            # 4. Re-propose the cells whose left codes changed (past the frontier: checked again next pass).
            new_codes, next_q, moved = self._repropose(cells, codes, todo, new_codes, next_q, *repropose_noise)
            changed = changed | moved
        self._store(cells, seen, todo, checked, changed, exact, new_codes, next_q, predicting)
        self.done.copy_(torch.maximum(self.done, new_done))  # in place: a graph's new tensor would be its output

    def _repropose(self, cells, codes, todo, new_codes, next_q, accept_noise, residual_noise):
        """A cell this pass verified, whose left codes it also changed, is checked next against a target conditioned
        on the new codes, while its code is a sample of this pass's target p. The in-row drafter predicts how the
        target moves: q' = norm(p (q_d(new left) / q_d(old left)) ** power) (`sampling.reweighted`). One
        accept/resample step of the code against q' makes it a sample of q', its new q: the next check stays
        lossless, and accepts more often (docs/decoding.md, "Re-proposals"). Every window position is computed and
        the ones that qualify are kept. Returns the codes, q and which moved."""
        run, cols, W = self.run, self.grid.cols, self.window
        steps = torch.arange(1, self.drafter.left_codes + 1, device=cells.device)
        cell = cells.clamp_min(0)
        old_left = run.codes[self.images[:, None, None], (cell[..., None] - steps).clamp_min(0)]  # [B, W + 1, L]
        index = torch.arange(W + 1, device=cells.device)[:, None] - steps  # [W + 1, L]: window index of x - j
        after = torch.where(todo, new_codes, codes)  # the window's codes once this pass is stored
        new_left = torch.where(index >= 0, after[self.images[:, None, None], index.clamp_min(0)], old_left)
        on_row = (cell % cols)[..., None] - steps >= 0  # x - j in the same row: consecutive window positions
        which = todo & (cells >= cols) & ((old_left != new_left) & on_row).any(dim=-1)  # [B, W + 1]
        both_lefts = torch.cat([old_left, new_left], dim=1)  # one drafter call for both
        q_old, q_new = run.probs(self._vertical_drafts(cell.repeat(1, 2), both_lefts)).chunk(2, dim=1)
        target = reweighted(next_q, q_old, q_new, self.repropose)
        moved_codes, _, kept = verify_with(new_codes, next_q, target, accept_noise, residual_noise)
        new_codes = torch.where(which, moved_codes, new_codes)
        next_q = torch.where(which[..., None], target, next_q)
        return new_codes, next_q, which & ~kept

    def _store(self, cells, seen, todo, checked, changed, exact, new_codes, next_q, predicting) -> None:
        """Write back what the pass gave the cells it touched: codes, their next q, final rounds, and the hidden
        states of every cell it saw (a cell no longer verified still drafts the cell below it from its latest).

        Every window position writes, untouched ones their cell's current values, so nothing waits for the host
        to learn which were touched. Window positions hold distinct cells; end-of-line and past-the-end ones
        write to cell 0, which is final from the prefill and never touched, and to the q ring's spare slot."""
        run = self.run
        cell = cells.clamp_min(0)  # [B, W + 1]
        scatter_where(run.codes, cell, new_codes, todo)
        scatter_where(self.q, torch.where(todo, cell % self.ring, self.ring), next_q, todo)
        scatter_where(self.hidden, self.both(cell), predicting.to(self.hidden.dtype), self.both(seen))
        scatter_where(self.passed, cell, torch.ones_like(seen), seen)
        # final_round: a new code drawn exactly is 0, a cell's first code 1, a code changed in check k shows k + 1
        k = self.verifications.gather(1, cell) + checked.long()
        scatter_where(self.verifications, cell, k, todo)
        since = torch.where(checked, k + 1, torch.where(exact, 0, 1))
        scatter_where(run.final_round, cell, since.to(run.final_round.dtype), changed)

    def missing(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cells of each next window [B, W] (UNDECODED where a position holds none) and which have no code."""
        positions = self.done[:, None] + torch.arange(1, self.window + 1, device=self.done.device)
        cells = self.cell_at[positions.clamp_max(self.grid.sequence_length)]
        return cells, (cells >= 0) & (self.run.codes.gather(1, cells.clamp_min(0)) < 0)

    def cells_to_draft(self) -> torch.Tensor:
        return self.missing()[1].sum(dim=1)

    def _draft(self, progress: Progress, noise: torch.Tensor) -> None:
        """1. Draft the first `progress.to_draft` cells without a code of each window (all of them), in raster order:
        in `draft_steps` steps, or one a step for an in-row drafter, each drafting every one whose inputs are there.
        The j-th of an image's cells draws with noise [B, W] column j, whichever step drafts it. With static passes
        every step takes the whole window, its cells past the count masked, so that one graph serves every pass;
        with compiled steps an in-row drafter takes W steps, all of them one graph (a step past the count drafts
        nothing), so that neither the count nor a loop of launches follows the data."""
        count = progress.to_draft
        if count == 0:
            return
        cells, missing = self.missing()
        slot = torch.where(missing, torch.arange(self.window, device=cells.device), self.window)
        width = self.window if self.run.runner.static else count
        order = slot.sort(dim=1).values[:, :width]  # [B, n]: window index of each image's j-th missing cell
        valid = (order < self.window) & (torch.arange(width, device=cells.device) < count)
        cells = torch.where(valid, cells.gather(1, order.clamp_max(self.window - 1)), 0)  # cell 0 is never drafted
        first_row = progress.done < self.grid.cols  # some image's window may reach into the first row
        steps = self.draft_steps
        if self.drafter.left_codes:
            steps = self.window if self.run.runner.compiles_steps else count
        draft = self.run.runner.step(FrontierRun._draft_steps, "the drafting steps")
        draft(self, cells, valid, noise[:, :width], first_row, steps)

    def _draft_steps(self, cells, valid, noise, first_row: bool, steps: int) -> None:
        """`steps` drafting steps in a row: one graph where the steps are compiled."""
        for _ in range(steps):
            self._draft_step(cells, valid, noise, first_row)

    def _draft_step(self, cells: torch.Tensor, valid: torch.Tensor, noise: torch.Tensor, first_row: bool) -> None:
        """Draft each of cells [B, n] that is `valid`, has no code and whose inputs are there, with noise [B, n]."""
        run, grid = self.run, self.grid
        has_code = run.codes.gather(1, cells) >= 0
        drafted, can = self._vertical_drafts(cells), self._vertical_ready(cells)
        if first_row:
            right, can_right = self._horizontal_drafts(cells)
            drafted = torch.where(self.both(cells < grid.cols)[..., None], right, drafted)
            can = torch.where(cells < grid.cols, can_right, can)
        can &= valid & ~has_code
        q = run.probs(drafted)  # [B, n, K]
        scatter_where(run.codes, cells, sample_with(q, noise), can)
        scatter_where(self.q, torch.where(can, cells % self.ring, self.ring), q, can)
        scatter_where(self.hidden, self.both(cells), drafted.to(self.hidden.dtype), self.both(can))
        scatter_where(run.final_round, cells, torch.ones_like(cells), can)

    def _hidden_at(self, cells: torch.Tensor) -> torch.Tensor:
        """The latest hidden states predicting cells [B, ...] in both branches -> [B', ..., d]."""
        index = self.both(cells)
        flat = self.hidden.gather(1, index.flatten(1)[..., None].expand(-1, -1, self.hidden.shape[-1]))
        return flat.view(*index.shape, -1)

    def _near_above(self, cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The row above's cells x - reach..x + reach of each cell [B, n] -> (those cells [B, n, k] clamped onto the
        row, and whether each is on it)."""
        cols, reach = self.grid.cols, self.drafter.reach
        columns = (cells % cols)[..., None] + torch.arange(-reach, reach + 1, device=cells.device)
        row_above = (cells // cols - 1).clamp_min(0)[..., None]
        return row_above * cols + columns.clamp(0, cols - 1), (columns >= 0) & (columns < cols)

    def _left_of(self, cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cells x - 1..x - left_codes of each cell [B, n] in its own row -> (cells [B, n, L], whether on it)."""
        steps = torch.arange(1, self.drafter.left_codes + 1, device=cells.device)
        return (cells[..., None] - steps).clamp_min(0), (cells % self.grid.cols)[..., None] - steps >= 0

    def _vertical_ready(self, cells: torch.Tensor) -> torch.Tensor:
        """Whether every code the vertical drafter reads for each cell [B, n] (rows >= 1) is there."""
        codes = self.run.codes
        near, on = self._near_above(cells)
        ready = ((codes.gather(1, near.flatten(1)).view_as(near) >= 0) | ~on).all(dim=-1)
        if self.drafter.left_codes:
            left, on_row = self._left_of(cells)
            ready &= ((codes.gather(1, left.flatten(1)).view_as(left) >= 0) | ~on_row).all(dim=-1)
        return ready & (cells >= self.grid.cols)

    def _vertical_drafts(self, cells: torch.Tensor, left_codes: torch.Tensor | None = None) -> torch.Tensor:
        """The vertical drafter's hidden states [B', n, d] for cells [B, n] of rows >= 1 (others: any values): from
        the row above's codes and latest states around each (zeros off the row); the in-row kinds also from the
        codes at x - 1..x - left_codes, left_codes [B, n, L] (default: the codes there now; start vectors off the
        row); "recurrent" also from the latest state predicting the cell to the left (zeros at x = 0)."""
        run, drafter = self.run, self.drafter
        near, on = self._near_above(cells)
        on = self.both(on)[..., None]
        h = torch.where(on, self._hidden_at(near), 0)  # [B', n, k, d]
        e = torch.where(on, run.embed_codes(run.codes.gather(1, near.flatten(1)).view_as(near).clamp_min(0)), 0)
        context = drafter.context_at(h, e)
        left = state = None
        if drafter.left_codes:
            left_cells, on_row = self._left_of(cells)
            if left_codes is None:
                left_codes = run.codes.gather(1, left_cells.flatten(1)).view_as(left_cells)
            left = drafter.start_embeds(run.embed_codes(left_codes.clamp_min(0)), self.both(~on_row))
        if drafter.reads_left_state:
            left_state = self._hidden_at((cells - 1).clamp_min(0))
            state = torch.where(self.both(cells % self.grid.cols > 0)[..., None], left_state, 0)
        return drafter.step(context, left, state).to(self.hidden.dtype)

    def _horizontal_drafts(self, cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """First row: the horizontal heads' hidden states [B', n, d] for cells [B, n] right of the rightmost cell
        that has been through a pass, and which of them they reach."""
        cols = self.grid.cols
        passed_cols = torch.where(self.passed[:, :cols], torch.arange(cols, device=cells.device), -1)
        base = passed_cols.amax(dim=1)  # [B]
        offset = cells - base[:, None]
        can = (offset >= 1) & (offset <= self.horizontal)
        if not self.horizontal:
            return self._hidden_at(cells), can
        h = self._hidden_at(base[:, None])[:, 0]
        e = self.run.embed_codes(self.run.codes.gather(1, base[:, None])[:, 0])
        every = self.heads.draft_right(h, e, self.horizontal)  # [B', k_h, d]
        pick = self.both(offset.clamp(1, self.horizontal) - 1)[..., None].expand(-1, -1, every.shape[-1])
        return every.gather(1, pick), can
