"""torch.compile for a model's passes and the engines' steps, with eager as the reference: what a `CompiledRunner`
(runner.py) runs its work through.

Each function is compiled once per shape of calls, over a code object of its own, with fullgraph=True
(`Specialization`); a call reports what ran compiled, eagerly or was compiled anew in its `CompileReport`. A
function the backend cannot compile runs eagerly for those shapes from then on, said in each call's warnings:
capture never crashes a call. Under CUDA graphs what a graph returns is cloned before the next one runs, never kept
(docs/decoding.md, "Compiled passes"); every compiled call runs on the model's one owning thread (`PassOwner`).
"""

from __future__ import annotations

import functools
import queue
import threading
import types
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_map_only

CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def uses_cuda_graphs(options: dict) -> bool:
    """Whether torch.compile with `options` replays its graphs as CUDA graphs (on a GPU): by mode, or by inductor's
    own switch. Their outputs are then overwritten by the next replay, and what they write in place must be held at
    fixed addresses (`runner.Workspace`)."""
    return options.get("mode") in CUDA_GRAPH_MODES or bool(options.get("options", {}).get("triton.cudagraphs"))


@dataclass
class CompileReport:
    """What one decoding call's compiled functions did (`DecodingStrategy.decode` opens one a call, in a context
    variable: concurrent calls never mix their reports). Read into the call's stats and warnings."""

    compiled: int = 0  # calls that ran through a compiled graph
    eager: int = 0  # calls of a compiled function that ran eagerly, its backend having failed on their shapes
    graphs: int = 0  # graphs dynamo compiled during the call: new shapes, or a recompile
    warnings: list[str] = field(default_factory=list)

    def say(self, sentence: str) -> None:
        if sentence not in self.warnings:
            self.warnings.append(sentence)


CALL_REPORT: ContextVar[CompileReport | None] = ContextVar("ssd_compile_report", default=None)


def signature(value, static: bool = True) -> object:
    """What selects a function's specialization from one argument: a tensor's shape (its rank where shapes are
    dynamic), dtype and device; an object's `compile_key` (what of its Python state the graphs read); a number's
    value; anything else its type."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape) if static else value.dim(), value.dtype, value.device
    if isinstance(value, (tuple, list)):
        return tuple(signature(item, static) for item in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    key = getattr(value, "compile_key", None)
    return type(value) if key is None else key


def own_code(fn: Callable) -> Callable:
    """`fn` on a copy of its code object. Dynamo keeps compiled code per code object, and gives up on one after 8
    entries (`recompile_limit`) by running it eagerly: on a shared code object (transformers' `deprecate_kwarg`
    wrapper is every model's forward) every model, width and batch would spend the same 8."""
    if isinstance(fn, types.MethodType):
        return types.MethodType(own_code(fn.__func__), fn.__self__)
    if not isinstance(fn, types.FunctionType):
        fn = fn.__call__
        return own_code(fn) if isinstance(fn, (types.FunctionType, types.MethodType)) else fn
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return functools.wraps(fn)(copy)


def cause_of(error: BaseException) -> str:
    """A compile failure in a few words: dynamo's error, and the backend's own beneath it."""
    inner = getattr(error, "inner_exception", None) or error.__cause__
    said = str(inner or error).strip()
    first = said.splitlines()[0] if said else ""
    return f"{type(error).__name__}{f' from {type(inner).__name__}' if inner else ''}: {first}"


def code_of(fn: Callable):
    return (fn.__func__ if isinstance(fn, types.MethodType) else fn).__code__


class Specialization:
    """One shape of calls (`signature`) of a compiled function: torch.compile over a code object of its own, with
    fullgraph=True, so that a graph break or dynamo's recompile limit raises instead of running eagerly unseen."""

    def __init__(self, fn: Callable, options: dict):
        self.fn = own_code(fn)
        self.code = code_of(self.fn)
        self.compiled: Callable | None = torch.compile(self.fn, **{"fullgraph": True, **options})
        self.failure = ""  # why it runs eagerly, once it does

    def graphs(self) -> int:
        return len(torch._dynamo.eval_frame._debug_get_cache_entry_list(self.code))


class CompiledFunction:
    """`fn` through `torch.compile`, one specialization per shape of calls, each eager once the backend has failed
    on it.

    Every call of every pipeline that shares the function shares its graphs; what a call writes lives in the tensors
    it passes, never here. A failure of dynamo or the backend (compile time, before the graph wrote anything) makes
    that specialization eager from then on, said in the call's warnings and as a RuntimeWarning; any other error (an
    out-of-memory in a replay, say) is the call's own and raises, so a write is never applied twice."""

    def __init__(self, fn: Callable, options: dict, what: str, cuda_graphs: bool = False):
        self.fn, self.options, self.what, self.cuda_graphs = fn, options, what, cuda_graphs
        self.static = options.get("dynamic") is False
        self.specializations: dict[object, Specialization] = {}
        self.warned = False

    @property
    def active(self) -> bool:
        """Whether every specialization so far runs compiled."""
        return all(s.compiled is not None for s in self.specializations.values())

    def graphs(self) -> int:
        return sum(s.graphs() for s in self.specializations.values())

    def __call__(self, *args, **kwargs):
        key = signature(args, self.static), signature(tuple(kwargs.items()), self.static)
        known = self.specializations.get(key)
        if known is None:  # dict.setdefault is atomic: threads share one
            known = self.specializations.setdefault(key, Specialization(self.fn, self.options))
        report = CALL_REPORT.get() or CompileReport()
        compiled = known.compiled
        if compiled is not None:
            before = known.graphs()
            try:
                result = compiled(*args, **kwargs)
            except torch._dynamo.exc.TorchDynamoException as error:
                known.compiled = None
                known.failure = cause_of(error)
                if not self.warned:  # the log's, once; every call it serves says so in its own warnings
                    self.warned = True
                    warnings.warn(
                        f"torch.compile could not compile {self.what} ({known.failure}): from now on it runs "
                        "eagerly for calls of these shapes.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            else:
                report.compiled += 1
                added = known.graphs() - before
                report.graphs += added
                if added and before:
                    report.say(
                        f"{self.what} was compiled again for shapes it had been compiled for ({before + added} "
                        "graphs now): a guard on its inputs failed; TORCH_LOGS=recompiles says which."
                    )
                # a CUDA graph's next replay overwrites what it returned
                return tree_map_only(torch.Tensor, torch.clone, result) if self.cuda_graphs else result
        report.eager += 1
        report.say(f"{self.what} ran eagerly: torch.compile could not compile it ({known.failure}).")
        return self.fn(*args, **kwargs)


class PassOwner:
    """The one thread that runs every compiled call of a model, whoever calls: as gpt-fast and vLLM keep GPU work on
    one owner. Under CUDA graphs each thread records its own graph trees, memory pool and held state, so calls from
    a demo's or ComfyUI's worker threads would each record anew; on the owner they replay one set. Calls queue
    there, one at a time; each keeps its state in itself.

    The caller's row callback still runs in the caller's thread (progress bars, previews, ComfyUI's interrupt): the
    owner hands each committed row over and waits for the answer. A callback that raises stops the call after that
    row, and the error is raised in the caller."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ssd-compiled-passes")
        self.thread: threading.Thread | None = None

    def run(self, work: Callable, callback: Callable | None):
        """work(callback) on the owner, with callback(row, codes) relayed back to this thread."""
        if threading.current_thread() is self.thread:  # already on the owner
            return work(callback)
        rows: queue.SimpleQueue = queue.SimpleQueue()

        def relayed(row, codes):
            answer: queue.SimpleQueue = queue.SimpleQueue()
            rows.put((row, codes, answer))
            return answer.get()

        def owned():
            self.thread = threading.current_thread()
            return work(None if callback is None else relayed)

        future = self.pool.submit(owned)
        future.add_done_callback(lambda _: rows.put(None))
        error = None
        while (handed := rows.get()) is not None:
            row, codes, answer = handed
            try:
                stop = error is not None or bool(callback(row, codes))
            except BaseException as raised:  # noqa: BLE001 - the caller's, raised below once the owner has stopped
                error, stop = raised, True
            answer.put(stop)
        if error is not None:
            raise error
        return future.result()
