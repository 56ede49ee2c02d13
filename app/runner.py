"""One pipeline call in a worker thread, its committed rows streamed to the caller, and the Stop flags.

Gradio shows a generator's yields as they come, but the pipeline reports rows
through a callback inside its own call. So the call runs in a worker thread
and its callback puts the rows on a queue that the generator reads. Stopping is
per request: the Stop button sets a flag, which the callback turns into
`pipe._interrupt = True` (it stops only the call it is set in).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ssd_pipelines import SSDPipelineOutput
from ssd_pipelines.decoding import DEFAULT_DECODING, option_default, options_for


@dataclass(frozen=True)
class Settings:
    """The controls of one generation, as the pipeline takes them; values are passed on unconverted, so that the
    pipeline's own checks refuse a bad one (a 2.7 is not a 2)."""

    prompt: str
    negative_prompt: str = ""
    seed: int = 0
    num_images: int = 1
    guidance_scale: float | None = None  # None: the model's own default
    temperature: float = 1.0
    top_k: int | None = None  # None or 0: no top-k filter
    decoding: str = DEFAULT_DECODING
    verify_rounds: int = option_default("ssd", "verify_rounds")
    vertical_rows: int = option_default("ssd", "vertical_rows")

    def pipeline_kwargs(self, decoding: str | None = None) -> dict:
        """Arguments of `pipe(...)` for `decoding` (default: ours): options a decoding does not take are left out,
        since the pipeline rejects them."""
        decoding = decoding or self.decoding
        return {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt or None,
            "num_images_per_prompt": self.num_images,
            "guidance_scale": self.guidance_scale,
            "temperature": self.temperature,
            "top_k": None if self.top_k == 0 else self.top_k,
            "generator": torch.Generator().manual_seed(self.seed),
            "decoding": decoding,
            "output_type": "pil",
            **options_for(decoding, verify_rounds=self.verify_rounds, vertical_rows=self.vertical_rows),
        }


@dataclass(frozen=True)
class RowsCommitted:
    """The latest committed rows: `codes` [B, R, C], -1 where a cell is not committed yet."""

    rows: int
    codes: torch.Tensor


@dataclass(frozen=True)
class Finished:
    output: SSDPipelineOutput


def stream(pipe, kwargs: dict, stop: threading.Event) -> Iterator[RowsCommitted | Finished]:
    """Run `pipe(**kwargs)` in a worker thread; yield its newest committed rows, then `Finished`.

    Rows the reader had no time for are skipped, not queued up. The call's exception is raised here.
    Closing the iterator early (the page went away) stops the call and waits for its thread.
    """
    events: queue.Queue = queue.Queue()
    abandoned = threading.Event()

    def on_row(pipe, row: int, timestep: int, callback_kwargs: dict) -> dict:
        events.put(RowsCommitted(row + 1, callback_kwargs["codes"]))
        if stop.is_set() or abandoned.is_set():
            pipe._interrupt = True
        return {}

    def work() -> None:
        try:
            events.put(Finished(pipe(**kwargs, callback_on_step_end=on_row)))
        except BaseException as error:  # noqa: BLE001 (handed to the reader, who raises it)
            events.put(error)

    thread = threading.Thread(target=work, name="ssd-demo-call", daemon=True)
    thread.start()
    try:
        while True:
            event = events.get()
            while isinstance(event, RowsCommitted) and not events.empty():
                event = events.get_nowait()
            if isinstance(event, BaseException):
                raise event
            yield event
            if isinstance(event, Finished):
                return
    finally:
        abandoned.set()
        thread.join()


class StopFlags:
    """Stop flags of the running generations, by Gradio session: Stop sets the flags of its own session only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flags: dict[str, set[threading.Event]] = {}

    @contextmanager
    def track(self, session: str) -> Iterator[threading.Event]:
        flag = threading.Event()
        with self._lock:
            self._flags.setdefault(session, set()).add(flag)
        try:
            yield flag
        finally:
            with self._lock:
                flags = self._flags[session]
                flags.discard(flag)
                if not flags:
                    del self._flags[session]

    def stop(self, session: str) -> int:
        """Set the session's flags; returns how many generations were asked to stop."""
        with self._lock:
            flags = list(self._flags.get(session, ()))
        for flag in flags:
            flag.set()
        return len(flags)
