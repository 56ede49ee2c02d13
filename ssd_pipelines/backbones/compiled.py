"""torch.compile for a pipeline's passes and drafting steps, with eager as the reference (issue 39, part 3).

`pipe.enable_compiled_passes(**options)` leaves one `CompiledPasses` on the backbone's decoder module, which
every adapter of the pipeline shares: the forward pass, and each engine step that asks for it (`compiled`),
run through `torch.compile(fn, **options)`. A function the backend cannot compile runs eagerly from then on,
said once in `warnings`: capture never crashes a call.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch


class CompiledFunction:
    """`fn` through `torch.compile`, or eagerly once the backend has failed on it.

    torch.compile keeps its compiled code on `fn`'s code object, guarded by the inputs' types, shapes, devices and
    dtypes: every call of every pipeline that shares the function shares the graphs, a call on another device or
    dtype compiles anew, and what a call writes lives in the tensors it passes, never here."""

    def __init__(self, fn: Callable, options: dict, what: str):
        self.eager, self.what = fn, what
        self.compiled: Callable | None = torch.compile(fn, **options)

    @property
    def active(self) -> bool:
        return self.compiled is not None

    def __call__(self, *args, **kwargs):
        compiled = self.compiled
        if compiled is not None:
            try:
                return compiled(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - whatever dynamo or the backend raise, before the graph writes
                self.compiled = None
                reason = str(error).splitlines()[0] if str(error) else ""
                warnings.warn(
                    f"torch.compile could not compile {self.what} ({type(error).__name__}: {reason}): "
                    "from now on it runs eagerly.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self.eager(*args, **kwargs)


class CompiledPasses:
    """What `enable_compiled_passes` asked for: the options, the compiled forward, the steps compiled so far."""

    def __init__(self, forward: Callable, options: dict):
        self.options = options
        self.forward = CompiledFunction(forward, options, "this backbone's pass")
        self.steps: dict[Callable, CompiledFunction] = {}

    @property
    def static(self) -> bool:
        """Passes over the image take static shapes (dynamic=False): one graph serves every pass of a width."""
        return self.options.get("dynamic") is False

    def step(self, fn: Callable, what: str) -> CompiledFunction:
        """`fn` compiled with the passes' options, made once (dict.setdefault is atomic: threads share one)."""
        known = self.steps.get(fn)
        return known if known is not None else self.steps.setdefault(fn, CompiledFunction(fn, self.options, what))
