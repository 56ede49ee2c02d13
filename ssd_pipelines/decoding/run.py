"""One decoding call's state: the backbone, the sampling path, the codes so far, and the statistics.

A strategy's passes go through `DecodeRun.prefill` and `DecodeRun.forward`, which count them, and its committed rows
through `rows_committed`, which tells the callback.
"""

from __future__ import annotations

import torch

from ..backbones.base import ImageBackbone, ImageGrid, KVState, PromptBatch
from ..sampling import (
    NoiseTape,
    RandomSource,
    SamplingConfig,
    SamplingTensors,
    random_source,
    repeat_last_image,
    sample,
    target_probs,
    uniform,
)
from .batch_buckets import real_rows
from .block import Block
from .output import UNDECODED, DecodeOutput, DecodeStats


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


class DecodeRun:
    """One decoding call: the backbone, the sampling path, the codes so far and the statistics."""

    def __init__(self, backbone, prompts, grid, sampling, generator, callback, strategy_name, images=None):
        """images: the real images when `prompts` is padded with clones of its last (`batch_buckets`)."""
        self.backbone: ImageBackbone = backbone
        self.prompts: PromptBatch = prompts
        self.images: int = prompts.batch_size if images is None else images
        self.grid: ImageGrid = grid
        self.sampling: SamplingConfig = sampling
        self.settings = SamplingTensors.of(sampling, backbone.device)  # what compiled steps read: never a recompile
        self.generator: RandomSource = random_source(generator, self.images)
        self.callback = callback
        cells = (prompts.batch_size, grid.num_cells)
        self.runner = backbone.runner  # who runs the passes and the steps (`backbones/runner.py`)
        device = backbone.device
        self.codes = self.runner.full("codes", cells, UNDECODED, torch.long, device)  # written in place by steps
        self.final_round = self.runner.full("final_round", cells, UNDECODED, torch.long, device)  # see DecodeOutput
        self.real = torch.arange(prompts.batch_size, device=device) < self.images  # [B]: not a padding clone
        self.stats = DecodeStats(strategy=strategy_name, images=self.images, chosen_decoding=strategy_name)
        self.hidden: torch.Tensor | None = None  # set by strategies that record states for distillation
        self.stopped = False
        self.warnings: list[str] = []  # for the caller to show (`DecodeOutput.warnings`)

    @property
    def compile_key(self) -> tuple:
        """What of this call's Python state compiled steps read (`compiled.signature`): one specialization each."""
        settings = self.settings
        return (
            self.prompts.batch_size,
            self.prompts.guidance,
            self.grid,
            settings.greedy,
            settings.top_k is None,
            settings.top_p_floor is None,
            type(self.backbone),
        )

    def probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-norm hidden states [B', ..., d] -> target distributions [B, ..., K]."""
        return target_probs(self.backbone.code_logits(hidden), self.settings)

    def noise_tape(self, width: int) -> NoiseTape:
        """The noise of a decoding loop, `width` uniforms a step per image; padding images draw their clone's."""
        batch = self.prompts.batch_size
        return NoiseTape(self.generator, batch, width, self.codes.device, images=self.images)

    def uniform(self, shape: tuple[int, ...]) -> torch.Tensor:
        """U[0, 1) noise [B, ...] drawn in one piece, image b's row from its generator; padding images repeat the
        last real one's."""
        noise = uniform((self.images, *shape[1:]), self.generator, self.codes.device)
        return repeat_last_image(noise, shape[0])

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

    def count_pass(self, positions: int) -> None:
        """One backbone pass after the prefill, carrying `positions` image positions per image: every decoding,
        the peers' included, counts its passes here, so their statistics compare passes and what each carries."""
        self.stats.forward_passes += 1
        self.stats.positions_processed += positions

    def forward(self, state: KVState, block: Block, codes: torch.Tensor) -> torch.Tensor:
        """One backbone pass over a block's codes [B, n_cells] -> output hidden states [B', n_pos, d]."""
        self.count_pass(block.num_positions)
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
        """A copy of the real images' [B, R * C] as [B, R, C], UNDECODED in every row past `rows_completed` (a block
        may have filled rows that were never reported, or stopped halfway)."""
        grid = cells[: self.images].view(-1, self.grid.rows, self.grid.cols).clone()
        grid[:, self.stats.rows_completed :] = UNDECODED
        return grid

    def output(self) -> DecodeOutput:
        self.stats.interrupted = self.stats.rows_completed < self.grid.rows
        hidden = None
        if self.hidden is not None:
            hidden = real_rows(self.hidden, self.images, self.prompts.batch_size)
            hidden = hidden.view(-1, self.grid.rows, self.grid.cols, self.hidden.shape[-1])
        return DecodeOutput(
            self._committed_grid(self.codes), self.stats, self._committed_grid(self.final_round), hidden, self.warnings
        )
