"""What one call of a pipeline may change on it, kept per thread: pipelines are served from worker threads (Gradio,
ComfyUI), and a call served beside another must neither stop it nor be stopped by it."""

from __future__ import annotations

import threading


class PerThreadInterrupt:
    """diffusers' `_interrupt` flag, set from `callback_on_step_end` to stop the call running in this thread."""

    @property
    def _call_state(self) -> threading.local:
        return self.__dict__.setdefault("_ssd_call_state", threading.local())  # setdefault is atomic

    @property
    def _interrupt(self) -> bool:
        return getattr(self._call_state, "interrupt", False)

    @_interrupt.setter
    def _interrupt(self, value: bool) -> None:
        self._call_state.interrupt = bool(value)
