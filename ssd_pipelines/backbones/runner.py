"""Who runs a model's work for the decoding engines: as written in the caller's thread, or compiled on one owner.

The engines never ask a backbone how its passes run. They ask its `runner` for three things: a state tensor that
steps write in place (`full`), a step through the passes' compilation (`step`), and where the whole call runs
(`run`). The adapters only answer "embed, hidden, logits"; `CausalLMBackbone` runs its decoder through
`CompiledRunner.forward` when one is installed (`compile_passes`).

`pipe.enable_compiled_passes(**options)` leaves one `CompiledRunner` on the backbone's decoder module, which every
adapter of the pipeline shares. It owns the GPU work in the way of gpt-fast's `setup_caches` and vLLM's model
runner: the compiled forward and steps (compiled.py), one workspace of state held from call to call where graphs
replay as CUDA graphs, and the one thread every compiled call runs on (`PassOwner`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .compiled import CompiledFunction, PassOwner, uses_cuda_graphs


class EagerRunner:
    """Passes and steps as written, in the caller's thread, on new tensors: the reference every mode matches."""

    active = False  # whether the passes run compiled
    static = False  # whether the passes over the image take static shapes (one graph a width)
    cuda_graphs = False
    compiles_steps = False  # whether `step` compiles: a step's loop then runs as one graph
    buckets_batches = False  # whether a call's batch is padded to a bucket, so few batch sizes compile

    def full(self, role: str, shape: tuple[int, ...], fill, dtype: torch.dtype, device) -> torch.Tensor:
        """A call's state tensor that steps write in place, filled with `fill`; `role` names it among the call's
        state (a `CompiledRunner` under CUDA graphs holds one a role)."""
        return torch.full(shape, fill, dtype=dtype, device=device)

    def step(self, fn: Callable, what: str) -> Callable:
        """An engine's step `fn`, compiled with the passes where they are (`what` names it in warnings)."""
        return fn

    def run(self, work: Callable, callback: Callable | None):
        """work(callback): a whole decoding call, in this thread."""
        return work(callback)


EAGER = EagerRunner()  # holds nothing: every eager backbone shares it


class Workspace:
    """The state compiled graphs write in place, kept from one call to the next, one tensor a role.

    A CUDA graph replays over the addresses it was recorded with: a tensor it writes must be a static input (or
    inductor runs the graph without one), and a call whose state sits elsewhere records the graph anew, each
    recording kept (inductor's trees never drop one). So a call takes its state from here: the next call of the same
    shapes writes where the last one did, and replays. Only the owner's thread calls it (`CompiledRunner.run`), one
    call at a time, so two calls never share a tensor; a call of other shapes (batch, grid, dtype, device) replaces
    the role's tensor."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def full(self, role: str, shape: tuple[int, ...], fill, dtype: torch.dtype, device) -> torch.Tensor:
        held = self.tensors.get(role)
        if held is None or held.shape != shape or held.dtype != dtype or held.device != torch.device(device):
            held = torch.empty(shape, dtype=dtype, device=device)
            torch._dynamo.mark_static_address(held, guard=False)  # an address change re-records, never recompiles
            self.tensors[role] = held
        return held.fill_(fill)


class CompiledRunner(EagerRunner):
    """What `enable_compiled_passes` asked for: the options, the compiled forward, the steps compiled so far, the
    workspace, and the owning thread."""

    def __init__(self, forward: Callable, options: dict):
        if uses_cuda_graphs(options) and options.get("dynamic"):
            raise ValueError(
                "CUDA graphs replay one shape each, and with dynamic=True the passes over the image grow with the "
                "key/value cache, so every pass would record a graph of its own: pass dynamic=False, or leave it "
                "unset (enable_compiled_passes then takes static passes under CUDA graphs)."
            )
        self.options = options
        self.compiles_steps = True
        self.buckets_batches = True  # graphs are per batch size: a few (`decoding/batch_buckets.py`)
        self.cuda_graphs = uses_cuda_graphs(options)
        self.static = options.get("dynamic") is False
        self.forward = CompiledFunction(forward, options, "this backbone's pass", self.cuda_graphs)
        self.steps: dict[Callable, CompiledFunction] = {}
        self.workspace = Workspace()
        self.owner = PassOwner()

    @property
    def active(self) -> bool:
        """Whether the passes run compiled: no shape of them has fallen back to eager."""
        return self.forward.active

    def full(self, role: str, shape: tuple[int, ...], fill, dtype: torch.dtype, device) -> torch.Tensor:
        if not self.cuda_graphs:
            return super().full(role, shape, fill, dtype, device)
        return self.workspace.full(role, shape, fill, dtype, device)

    def step(self, fn: Callable, what: str) -> CompiledFunction:
        known = self.steps.get(fn)
        if known is None:  # dict.setdefault is atomic: threads share one
            known = self.steps.setdefault(fn, CompiledFunction(fn, self.options, what, self.cuda_graphs))
        return known

    def run(self, work: Callable, callback: Callable | None):
        """work(callback) on the owner's thread, the callback relayed to this one (`PassOwner`)."""
        return self.owner.run(work, callback)
