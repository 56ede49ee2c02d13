"""torch.compile for a pipeline's passes and drafting steps, with eager as the reference (issue 39, part 3).

`pipe.enable_compiled_passes(**options)` leaves one `CompiledPasses` on the backbone's decoder module, which
every adapter of the pipeline shares: the forward pass, and each engine step that asks for it (`compiled`),
run through `torch.compile(fn, **options)`. A function the backend cannot compile runs eagerly from then on,
said once in `warnings`: capture never crashes a call.

Under CUDA graphs (mode="reduce-overhead" or "max-autotune") inductor replays a graph over the addresses it was
recorded with, and each replay writes its outputs into the same memory. So two rules hold there: a tensor a graph
writes in place is held at a fixed address from call to call (`HeldState`), and what a graph returns is cloned
before the next one runs (`CompiledFunction`), never kept (docs/decoding.md, "Compiled passes").
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map_only

CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def uses_cuda_graphs(options: dict) -> bool:
    """Whether torch.compile with `options` replays its graphs as CUDA graphs (on a GPU): by mode, or by inductor's
    own switch. Their outputs are then overwritten by the next replay, and what they write in place must be held at
    fixed addresses (`HeldState`)."""
    return options.get("mode") in CUDA_GRAPH_MODES or bool(options.get("options", {}).get("triton.cudagraphs"))


class HeldState(threading.local):
    """Per thread, the state compiled graphs write in place, kept from one call to the next.

    A CUDA graph replays over the addresses it was recorded with: a tensor it writes must be a static input (or
    inductor runs the graph without one), and a call whose state sits elsewhere records the graph anew, each
    recording kept (inductor's trees never drop one). So a call takes its state from here: the next call of the same
    shapes in the same thread writes where the last one did and replays. Threads hold their own (two calls never
    share state), one tensor a role: a call of other shapes replaces it."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def full(self, role: str, shape: tuple[int, ...], fill, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        held = self.tensors.get(role)
        if held is None or held.shape != shape or held.dtype != dtype or held.device != torch.device(device):
            held = torch.empty(shape, dtype=dtype, device=device)
            torch._dynamo.mark_static_address(held, guard=False)  # an address change re-records, never recompiles
            self.tensors[role] = held
        return held.fill_(fill)


class CompiledFunction:
    """`fn` through `torch.compile`, or eagerly once the backend has failed on it.

    torch.compile keeps its compiled code on `fn`'s code object, guarded by the inputs' types, shapes, devices and
    dtypes: every call of every pipeline that shares the function shares the graphs, a call on another device or
    dtype compiles anew, and what a call writes lives in the tensors it passes, never here."""

    def __init__(self, fn: Callable, options: dict, what: str, cuda_graphs: bool = False):
        self.eager, self.what, self.cuda_graphs = fn, what, cuda_graphs
        self.compiled: Callable | None = torch.compile(fn, **options)

    @property
    def active(self) -> bool:
        return self.compiled is not None

    def __call__(self, *args, **kwargs):
        compiled = self.compiled
        if compiled is not None:
            try:
                result = compiled(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - whatever dynamo or the backend raise, before the graph writes
                self.compiled = None
                reason = str(error).splitlines()[0] if str(error) else ""
                warnings.warn(
                    f"torch.compile could not compile {self.what} ({type(error).__name__}: {reason}): "
                    "from now on it runs eagerly.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            else:  # a CUDA graph's next replay overwrites what it returned
                return tree_map_only(torch.Tensor, torch.clone, result) if self.cuda_graphs else result
        return self.eager(*args, **kwargs)


class CompiledPasses:
    """What `enable_compiled_passes` asked for: the options, the compiled forward, the steps compiled so far."""

    def __init__(self, forward: Callable, options: dict):
        if uses_cuda_graphs(options) and options.get("dynamic"):
            raise ValueError(
                "CUDA graphs replay one shape each, and with dynamic=True the passes over the image grow with the "
                "key/value cache, so every pass would record a graph of its own: pass dynamic=False, or leave it "
                "unset (enable_compiled_passes then takes static passes under CUDA graphs)."
            )
        self.options = options
        self.forward = CompiledFunction(forward, options, "this backbone's pass", self.cuda_graphs)
        self.steps: dict[Callable, CompiledFunction] = {}
        self.held = HeldState()

    @property
    def static(self) -> bool:
        """Passes over the image take static shapes (dynamic=False): one graph serves every pass of a width."""
        return self.options.get("dynamic") is False

    @property
    def cuda_graphs(self) -> bool:
        return uses_cuda_graphs(self.options)

    def step(self, fn: Callable, what: str) -> CompiledFunction:
        """`fn` compiled with the passes' options, made once (dict.setdefault is atomic: threads share one)."""
        known = self.steps.get(fn)
        if known is None:
            known = self.steps.setdefault(fn, CompiledFunction(fn, self.options, what, self.cuda_graphs))
        return known
