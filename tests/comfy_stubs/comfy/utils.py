"""Stand-in for `comfy/utils.py`: the progress bar and its global hook, with ComfyUI's signatures.

As in ComfyUI, a bar captures the hook when it is made (the server sets one; outside it there is none), and
`update_absolute` clamps the value to the total before calling `hook(value, total, preview, node_id=...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PROGRESS_BAR_HOOK: Callable[..., Any] | None = None


def set_progress_bar_global_hook(function: Callable[..., Any] | None) -> None:
    global PROGRESS_BAR_HOOK
    PROGRESS_BAR_HOOK = function


class ProgressBar:
    def __init__(self, total: int, node_id: str | None = None):
        self.total = total
        self.current = 0
        self.hook = PROGRESS_BAR_HOOK
        self.node_id = node_id

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        if total is not None:
            self.total = total
        self.current = min(value, self.total)
        if self.hook is not None:
            self.hook(self.current, self.total, preview, node_id=self.node_id)

    def update(self, value: int) -> None:
        self.update_absolute(self.current + value)
