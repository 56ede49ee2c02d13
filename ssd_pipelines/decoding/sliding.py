"""What the two sliding-window engines share: `FrontierRun` (`exact`, pipelined `ssd`) and `WindowRun` (the 1D peers).

Both keep, per image of a batch, a frontier `done`: the positions of the image
sequence (end-of-line tokens included) committed to its KV cache. Each pass runs
the W positions from `done` on, clamped to the sequence's end (a finished image
idles there), and gets the target p of every position after the first up to and
including the one just past the window. The engines differ in what they draft and
in what they keep of a pass (docs/decoding.md, "Two engines").

The loop reads the host once a pass (`Progress`): whether to stop, which rows are
final for the callback, how far the next pass attends, and how many cells an
image drafts. Everything else stays on the device. On a GPU the frontier engine
reads it one pass late (`ProgressRead`, `SlidingWindow.ahead`), so that the host
queues pass k + 1 while the device runs pass k.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from .output import UNDECODED
from .rounds import RoundCounter
from .run import DecodeRun, both_branches, cells_by_position


@dataclass(frozen=True)
class Progress:
    """Where a batch stands before a pass, read from the device in one piece."""

    done: int  # the fewest positions any image has committed: the loop stops at the sequence's end
    final: int  # the earliest last final position of any image: rows up to it go to the callback
    furthest: int  # the most positions any image has committed: how far the next pass attends
    to_draft: int  # the most cells any image has to draft before the next pass


class ProgressRead:
    """`Progress` on its way to the host: on CUDA copied into pinned memory behind the queued work, with an event,
    so that asking for it does not wait; `result` waits for the copy (and for the work queued before it) alone."""

    def __init__(self, values: torch.Tensor):
        self.event = None
        if values.device.type == "cuda":
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(values.device))
            values = host
        self.values = values

    def result(self) -> Progress:
        if self.event is not None:
            self.event.synchronize()
        return Progress(*self.values.tolist())


@dataclass(frozen=True)
class Window:
    """Each image's window [B, W + 1]: positions (the last one just past the window), the cell at each (UNDECODED
    at an end-of-line token and past the end), its code (UNDECODED where none), and whether its p is valid."""

    positions: torch.Tensor
    cells: torch.Tensor
    codes: torch.Tensor
    ready: torch.Tensor


class SlidingWindow(ABC):
    """The state both engines keep per image, the window's placement, and the decode loop with its stop rule."""

    def __init__(self, run: DecodeRun, window: int):
        grid, device = run.grid, run.codes.device
        self.run, self.grid = run, grid
        self.window = min(window, grid.sequence_length)  # W: positions each pass runs per image
        self.cell_at = cells_by_position(grid, device)
        batch = run.prompts.batch_size
        self.images = torch.arange(batch, device=device)
        full = run.runner.full  # state the compiled steps write in place
        self.done = full("window.done", (batch,), 0, torch.long, device)  # [B] committed positions
        self.verifications = full("window.verifications", (batch, grid.num_cells), 0, torch.long, device)
        self.rounds = RoundCounter(grid.sequence_length + 2, device, full, run.real)  # every pass finalises a token

    def decode(self) -> None:
        """The loop, reading the host once a pass. Read late, a pass is queued on what the device said before the
        pass queued last (`ahead`), so the host never waits for the pass the device is running; the loop then
        stops one pass late, and the last pass idles (finished images change nothing)."""
        run, late = self.run, self.reads_progress_late
        self.start()
        pending = ProgressRead(self.progress_values())
        known = pending.result()
        while True:
            run.rows_final(known.final)
            if run.stopped or known.done >= self.grid.sequence_length:
                break
            self.step(self.ahead(known) if late else known)
            newest = ProgressRead(self.progress_values())  # the pass's one read of the host
            known, pending = (pending if late else newest).result(), newest
        self.rounds.write_to(run.stats)

    @property
    def reads_progress_late(self) -> bool:
        """Whether the loop reads `Progress` one pass late: on CUDA (on a CPU the host runs the kernels itself, and
        nothing is gained), for an engine whose `ahead` says how."""
        return self.can_read_late and self.run.codes.device.type == "cuda"

    can_read_late: ClassVar[bool] = False

    def ahead(self, known: Progress) -> Progress:
        """A `Progress` the next pass may run on when `known` is a pass old (the pass since may have moved every
        frontier): bounds under which the pass gives the codes an exact read gives."""
        raise NotImplementedError(f"{type(self).__name__} reads its progress as each pass ends.")

    @abstractmethod
    def start(self) -> None:
        """Prefill the prompts and draw the first cell from its exact distribution."""

    @abstractmethod
    def step(self, progress: Progress) -> None:
        """Draft what the windows lack, then run one pass."""

    def last_final(self) -> torch.Tensor:
        """Per image, the position of its last final token [B]: the token at `done` is final too."""
        return self.done

    def cells_to_draft(self) -> torch.Tensor:
        """Per image, how many cells it drafts before the next pass [B]; engines that draft by the host's count say."""
        return torch.zeros_like(self.done)

    def progress_values(self) -> torch.Tensor:
        """`Progress` as a device tensor [4], for `ProgressRead`."""
        return torch.stack([self.done.min(), self.last_final().min(), self.done.max(), self.cells_to_draft().max()])

    @property
    def starts(self) -> torch.Tensor:
        """First position of each image's window [B]: its `done`, or earlier at the end (finished images idle)."""
        return self.done.clamp_max(self.grid.sequence_length - self.window)

    def attended(self, progress: Progress) -> int:
        """Image positions the next pass attends over: up to the furthest window's end."""
        return min(progress.furthest + self.window, self.grid.sequence_length)

    def place(self) -> Window:
        """Each image's window from its `starts`. A position's p is valid when every position before it in the
        window holds a token; the first position's p is never used (it is committed)."""
        run, S, W = self.run, self.grid.sequence_length, self.window
        positions = self.starts[:, None] + torch.arange(W + 1, device=self.done.device)  # the last one is past
        cells = self.cell_at[positions.clamp_max(S)]
        codes = torch.where(cells >= 0, run.codes[self.images[:, None], cells.clamp_min(0)], UNDECODED)
        has_token = (positions < S) & ((cells < 0) | (codes >= 0))
        ready = torch.cat([torch.ones_like(has_token[:, :1]), has_token[:, :W].long().cumprod(dim=1).bool()], dim=1)
        return Window(positions, cells, codes, ready)

    def both(self, x: torch.Tensor) -> torch.Tensor:
        return both_branches(x, self.run.prompts.guidance)
