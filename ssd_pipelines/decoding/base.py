"""What every decoding strategy shares: the interface, its output and statistics, and blocks of cells.

A strategy turns a prompt batch into a grid of image codes by talking to an
`ImageBackbone`. It reports exact forward-pass counts (timings on shared
machines are noisy; passes are not) and calls an optional callback after every
committed row, which progress bars and live previews hang on.

Everything one call needs lives in its `DecodeRun`: a strategy object holds
only settings, so one strategy and one backbone may serve concurrent calls.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch

from ..backbones.base import ImageBackbone, ImageGrid, KVState, PromptBatch
from ..sampling import RandomSource, random_source, sample, target_probs
from .catalog import DECODINGS
from .options import DecodingOption, SamplingConfig

RowCallback = Callable[[int, torch.Tensor], bool | None]
"""Called as callback(row, codes [B, R, C]) once row `row` is committed; returning True stops decoding.
`codes` is a copy holding `UNDECODED` in every row after `row`."""

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


class RoundCounter:
    """Accumulates drafted/accepted cells per verification round on the device, read once at the end."""

    def __init__(self) -> None:
        self.drafted: list[torch.Tensor] = []
        self.accepted: list[torch.Tensor] = []

    def add(self, round_index: int, drafted: torch.Tensor, accepted: torch.Tensor) -> None:
        if round_index == len(self.drafted):
            self.drafted.append(torch.zeros((), dtype=torch.long, device=drafted.device))
            self.accepted.append(torch.zeros((), dtype=torch.long, device=drafted.device))
        self.drafted[round_index] += drafted
        self.accepted[round_index] += accepted

    def write_to(self, stats: DecodeStats) -> None:
        if self.drafted:  # read once, at the end
            stats.drafted_per_round, stats.accepted_per_round = (
                torch.stack([*self.drafted, *self.accepted]).view(2, -1).tolist()
            )


class CheckCounter:
    """Drafted and accepted cells by check: round k counts every cell's (k + 1)-th verification. Summed on the
    device by scatter, without a host sync per pass, and read once at the end."""

    def __init__(self, most_checks: int, device: torch.device, state_full) -> None:
        """most_checks: a bound on any cell's verifications (a frontier moves every pass: the passes' bound).
        state_full: the backbone's, which makes the state compiled steps write in place."""
        self.drafted = state_full("checks.drafted", (most_checks,), 0, torch.long, device)
        self.accepted = state_full("checks.accepted", (most_checks,), 0, torch.long, device)

    def add(self, checks_before: torch.Tensor, checked: torch.Tensor, accepted: torch.Tensor) -> None:
        """Cells of one pass: their earlier verifications, whether this pass checked them, whether it kept them."""
        index = checks_before.flatten().clamp(0, len(self.drafted) - 1)
        self.drafted.scatter_add_(0, index, checked.flatten().long())
        self.accepted.scatter_add_(0, index, (checked & accepted).flatten().long())

    def write_to(self, stats: DecodeStats) -> None:
        drafted, accepted = torch.stack([self.drafted, self.accepted]).tolist()  # read once, at the end
        rounds = sum(d > 0 for d in drafted)  # a cell checked k + 1 times was checked k times: no gaps
        stats.drafted_per_round, stats.accepted_per_round = drafted[:rounds], accepted[:rounds]


def cells_by_position(grid: ImageGrid, device: torch.device) -> torch.Tensor:
    """The cell at each position of the image sequence [S + 1]: UNDECODED at an end-of-line token, and at one
    position past the end (the one a full window's last output predicts)."""
    positions = torch.arange(grid.sequence_length, device=device)
    column = positions % grid.row_length
    cells = torch.where(column < grid.cols, positions // grid.row_length * grid.cols + column, UNDECODED)
    return torch.cat([cells, torch.full((1,), UNDECODED, device=device)])


def both_branches(x: torch.Tensor, guidance: bool) -> torch.Tensor:
    """Codes are shared by the conditional and unconditional branch: [B, ...] -> [B', ...]."""
    return torch.cat([x, x]) if guidance else x


@dataclass(frozen=True)
class Block:
    """Cells [first, end) of the grid in raster order, decoded together.

    A block spans positions of the flat image sequence: its cells, plus the forced
    end-of-line token after any row it completes. The backbone's output at each
    position predicts the next position, so the hidden state predicting the
    block's first cell comes from before the block (`h_before`).
    """

    grid: ImageGrid
    first: int
    end: int

    @property
    def num_cells(self) -> int:
        return self.end - self.first

    @property
    def first_row(self) -> int:
        return self.first // self.grid.cols

    @property
    def last_row(self) -> int:
        return (self.end - 1) // self.grid.cols

    def _position(self, cell):
        """Sequence position of a cell (an int, or a tensor of them)."""
        return (cell // self.grid.cols) * self.grid.row_length + cell % self.grid.cols

    def cell_positions(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Index of each cell among the block's sequence positions [n_cells], made on `device`: a pass indexes with
        them, and a copy from the host would make it wait."""
        return self._position(torch.arange(self.first, self.end, device=device)) - self._position(self.first)

    @property
    def num_positions(self) -> int:
        ends_row = self.end % self.grid.cols == 0
        last = self._position(self.end - 1) - self._position(self.first)
        return last + 1 + int(self.grid.has_eol and ends_row)

    def embed(self, backbone: ImageBackbone, codes: torch.Tensor) -> torch.Tensor:
        """Input embeddings of the block: codes [B', n_cells] with end-of-line tokens in place. -> [B', n_pos, d_e]"""
        code_embeds = backbone.embed_codes(codes)
        if self.num_positions == self.num_cells:
            return code_embeds
        eol = backbone.embed_token(self.grid.eol_token_id)
        embeds = eol.expand(codes.shape[0], self.num_positions, -1).clone()
        embeds[:, self.cell_positions(codes.device)] = code_embeds
        return embeds

    def predicting_hidden(self, h_before: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states predicting each cell: [B', d], [B', n_pos, d] -> [B', n_cells, d]."""
        shifted = torch.cat([h_before[:, None], hidden[:, :-1]], dim=1)  # position i is predicted by output i - 1
        return shifted[:, self.cell_positions(hidden.device)]

    def last_row_slice(self) -> tuple[slice, slice]:
        """(cells of this block in its last row, their columns): what the next row is drafted from."""
        start = max(self.first, self.last_row * self.grid.cols)
        return slice(start - self.first, self.num_cells), slice(
            start % self.grid.cols, (self.end - 1) % self.grid.cols + 1
        )


class DecodingStrategy(ABC):
    """Turns prompts into a grid of image codes through an `ImageBackbone`.

    The class attributes are what callers read about a strategy before making one: the pipeline checks a
    call against them. A strategy names itself; the rest is its entry in `catalog.DECODINGS`, which the CLI, the
    demo and the ComfyUI node read without importing torch."""

    name: ClassVar[str]
    # The rest is its `catalog.DecodingInfo`'s, copied by __init_subclass__; a strategy not in the catalog sets its own.
    summary: ClassVar[str]
    lossless: ClassVar[bool]
    needs_heads: ClassVar[bool] = False
    options: ClassVar[tuple[DecodingOption, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls) and cls.name in DECODINGS:  # a subclass that keeps its parent's name keeps its rest
            info = DECODINGS[cls.name]
            for declared in ("summary", "lossless", "needs_heads", "options"):
                setattr(cls, declared, getattr(info, declared))

    def decode(
        self,
        backbone: ImageBackbone,
        prompts: PromptBatch,
        sampling: SamplingConfig,
        generator: RandomSource | list[torch.Generator] = None,
        callback: RowCallback | None = None,
        grid: ImageGrid | None = None,
    ) -> DecodeOutput:
        """Decode one image per conditional row of the prompt batch.

        generator: one torch.Generator the whole batch draws from in order, or one per image (a list, in the
        batch's order, or `ImageGenerators`): then each image draws only from its own (`sampling.ImageGenerators`)."""
        if sampling.uses_guidance != prompts.guidance:
            raise ValueError(
                f"guidance_scale={sampling.guidance_scale} needs a prompt batch "
                f"{'with' if sampling.uses_guidance else 'without'} unconditional rows: encode the prompts with "
                f"guidance={sampling.uses_guidance}."
            )
        run = DecodeRun(backbone, prompts, grid or backbone.grid, sampling, generator, callback, self.name)
        run.stats.round_cap = self.round_cap
        started = time.perf_counter()
        with torch.inference_mode():
            self._decode(run)
        if run.codes.device.type == "cuda":
            torch.cuda.synchronize(run.codes.device)
        run.stats.seconds = time.perf_counter() - started
        return run.output()

    @property
    def round_cap(self) -> int | None:
        """The most verifications a cell gets, when the strategy stops there (lossy); None otherwise."""
        return None

    @abstractmethod
    def _decode(self, run: DecodeRun) -> None:
        """Fill `run.codes` in raster order, calling `run.rows_committed` as rows land."""


class DecodeRun:
    """One decoding call: the backbone, the sampling path, the codes so far and the statistics."""

    def __init__(self, backbone, prompts, grid, sampling, generator, callback, strategy_name):
        self.backbone: ImageBackbone = backbone
        self.prompts: PromptBatch = prompts
        self.grid: ImageGrid = grid
        self.sampling: SamplingConfig = sampling
        self.generator: RandomSource = random_source(generator, prompts.batch_size)
        self.callback = callback
        cells = (prompts.batch_size, grid.num_cells)
        self.codes = backbone.state_full("codes", cells, UNDECODED, torch.long)  # written in place by compiled steps
        self.final_round = backbone.state_full("final_round", cells, UNDECODED, torch.long)  # see DecodeOutput
        self.stats = DecodeStats(strategy=strategy_name, images=prompts.batch_size, chosen_decoding=strategy_name)
        self.hidden: torch.Tensor | None = None  # set by strategies that record states for distillation
        self.stopped = False

    def probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden states [B', ..., d] -> target distributions [B, ..., K]."""
        return target_probs(self.backbone.code_logits(hidden), self.sampling)

    def sample(self, probs: torch.Tensor, images: torch.Tensor | None = None) -> torch.Tensor:
        """One code per distribution [B, ..., K] -> [B, ...]; for flattened cells [n, K], images [n] says whose each
        row is, so that with one generator per image each draws from its own (`sampling.uniform`)."""
        return sample(probs, self.generator, images)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes [B, ...] -> embeddings for both guidance branches [B', ..., d_e]."""
        return self.backbone.embed_codes(both_branches(codes, self.prompts.guidance))

    def embed_positions(self, codes: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """Input embeddings [B', n, d_e] of image positions: codes [B, n], and the end-of-line token wherever
        cells [B, n] is negative (the position holds no cell)."""
        embeds = self.embed_codes(codes.clamp_min(0))
        if self.grid.has_eol:
            eol = both_branches(cells < 0, self.prompts.guidance)[..., None]
            embeds = torch.where(eol, self.backbone.embed_token(self.grid.eol_token_id).to(embeds.dtype), embeds)
        return embeds

    def prefill(self) -> tuple[KVState, torch.Tensor]:
        self.stats.forward_passes += 1
        return self.backbone.prefill(self.prompts)

    def forward(self, state: KVState, block: Block, codes: torch.Tensor) -> torch.Tensor:
        """One backbone pass over a block's codes [B, n_cells] -> output hidden states [B', n_pos, d]."""
        self.stats.forward_passes += 1
        self.stats.positions_processed += block.num_positions
        return self.backbone.extend(state, block.embed(self.backbone, both_branches(codes, self.prompts.guidance)))

    def rows_committed(self, up_to_row: int) -> None:
        """Rows up to `up_to_row` (inclusive) are final: tell the callback, which may ask to stop."""
        while self.stats.rows_completed <= up_to_row and not self.stopped:
            row = self.stats.rows_completed
            self.stats.rows_completed += 1
            if self.callback is not None:
                self.stopped = bool(self.callback(row, self._committed_grid(self.codes)))

    def rows_final(self, last_final: int) -> None:
        """The earliest position of any image's last final token (>= the sequence length when all are done): rows
        whose every cell is final in every image go to the callback."""
        grid = self.grid
        if last_final >= grid.sequence_length:
            rows = grid.rows
        else:
            rows = min(max((last_final - grid.cols + 1) // grid.row_length + 1, 0), grid.rows)
        if rows > 0:
            self.rows_committed(rows - 1)

    def _committed_grid(self, cells: torch.Tensor) -> torch.Tensor:
        """A copy of [B, R * C] as [B, R, C], UNDECODED in every row past `rows_completed` (a block may have
        filled rows that were never reported, or stopped halfway)."""
        grid = cells.view(-1, self.grid.rows, self.grid.cols).clone()
        grid[:, self.stats.rows_completed :] = UNDECODED
        return grid

    def output(self) -> DecodeOutput:
        self.stats.interrupted = self.stats.rows_completed < self.grid.rows
        hidden = (
            None if self.hidden is None else self.hidden.view(-1, self.grid.rows, self.grid.cols, self.hidden.shape[-1])
        )
        return DecodeOutput(
            self._committed_grid(self.codes), self.stats, self._committed_grid(self.final_round), hidden
        )
