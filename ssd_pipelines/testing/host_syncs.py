"""Count, on any machine, the calls that would block the host on a GPU.

On a GPU the host queues kernels ahead of the device. A value read back (`.item()`, `bool(t)`, `.tolist()`), a
copy to the host (`.cpu()`), a copy from pageable host memory (`torch.tensor(..., device=d)`, `x[[0, 2]]`, a host
tensor's `.to(d)`) or an output whose size depends on the data (`x[mask]`, `nonzero`) waits for everything queued
before it, so the next pass is not queued until the last one has run. On the CPU nothing waits, so we count the
calls instead: a test holds a decoding engine to a budget of them without a GPU.

Every tensor is taken for the device's, but for those seen born on the host inside the counted block: made by a
factory without `device=` (`torch.arange(n)`), drawn from a CPU generator, moved by `.cpu()` or `.to("cpu")`,
and what is computed from these alone. Reading those is free; moving one to the device is a copy ("h2d").
A `.to(d)` whose target is not written "cpu" is taken for a move to the device. A `non_blocking=True` copy is
taken for one from pinned memory, which does not wait: write it so on the CPU too (`.to(d, non_blocking=True)`,
pinning on CUDA only), or the CPU's branch is counted.

Two torch modes see the calls. A `TorchFunctionMode` sees the calls the code makes (`.tolist()`, `.cpu()`,
`torch.tensor(...)`, `x[[0, 2]]`) and names them; a `TorchDispatchMode` sees the scalar reads torch makes in C++,
which no Python hook sees (`x[t]` and `torch.full(size, t)` read a 0-d `t`), and the data-sized outputs.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
MODEL_PACKAGES = ("transformers", "diffusers")  # model code our code calls: its syncs are ours
COPIES = ("tolist", "cpu", "numpy", "to")  # Python-level calls that copy to the host (`to` when its target is "cpu")
FROM_DATA = ("tensor", "as_tensor", "new_tensor")
PRINTS = ("__format__", "__repr__", "__str__")  # one copy to the host, whatever torch's printing runs inside
# A scalar read in C++ is named after the Python call that made it; any other call (`x[t]`) reads an "item".
SCALAR_READS = {"__bool__": "bool", "__int__": "int", "__index__": "int", "__float__": "float"}
DATA_SIZED = (aten.nonzero, aten.nonzero_numpy, aten.argwhere, aten.masked_select, aten.bincount)
DATA_SIZED += (aten._unique2, aten.unique_dim, aten.unique_consecutive)
MASKS = (torch.bool, torch.uint8)
NOT_OURS = (str(Path(torch.__file__).parent) + os.sep, __file__)  # frames skipped in looking for a call's site


@dataclass
class HostSyncs:
    counts: collections.Counter = field(default_factory=collections.Counter)  # kind -> calls
    sites: collections.Counter = field(default_factory=collections.Counter)  # "package/path.py:LINE" -> calls

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def per(self, n: int) -> float:
        """Syncs per unit of work, e.g. per forward pass."""
        return self.total / n

    def summary(self, top: int = 5) -> str:
        """e.g. "12 (bool 10, item 2); ssd_pipelines/decoding/frontier.py:137 x10, ..." """
        kinds = ", ".join(f"{kind} {n}" for kind, n in self.counts.most_common())
        sites = ", ".join(f"{site} x{n}" for site, n in self.sites.most_common(top))
        return f"{self.total} ({kinds}); {sites}" if self.total else "0"


@functools.lru_cache(maxsize=4096)
def _package(path: str, names: tuple[str, ...]) -> tuple[str, str] | None:
    """(package, path from the package's folder) of a source file in one of the packages `names`."""
    parts = Path(path).parts
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in names:
            return parts[i], "/".join(parts[i:])
    return None


def _tensors(*trees) -> list[torch.Tensor]:
    """The tensors in `trees` (an argument tuple, a keyword dict, an op's output) and in the lists and tuples these
    hold, as deep as an op's arguments go: torch's `tree_leaves` would cost more than the ops it looks at."""
    found = []
    for item in trees:
        for x in item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else (item,):
            if isinstance(x, torch.Tensor):
                found.append(x)
            elif isinstance(x, (list, tuple)):
                found.extend(t for t in x if isinstance(t, torch.Tensor))
    return found


class _Count:
    """What both modes share: the counts, the packages whose calls count, the tensors on the host and the
    Python-level call in progress."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.syncs = HostSyncs()
        self.packages = tuple(packages)
        self.host: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self.calling: tuple = ("", ())  # (name, args) of the Python-level torch call running now

    def on_host(self, t: torch.Tensor) -> bool:
        return self.host.get(id(t)) is t

    def place(self, out, host: bool, source=None):
        """Mark what a call returned as on the host or the device. A move that returned its source on the CPU
        returns a view of it instead, as a GPU returns a new tensor: the source stays where it was."""
        if out is source and self.on_host(out) != host:
            out = out.view_as(out)
        for t in _tensors(out):
            if host:
                self.host[id(t)] = t
            else:
                self.host.pop(id(t), None)
        return out

    def record(self, kind: str | None) -> None:
        site = None if kind is None else self.site()
        if site is not None:
            self.syncs.counts[kind] += 1
            self.syncs.sites[site] += 1

    def site(self) -> str | None:
        """file:line of the innermost frame outside torch and this module, when that frame is in `packages`, or in
        model code that a frame in `packages` called; None when the call is someone else's (pytest's, torch's)."""
        site, frame = None, sys._getframe()
        while frame is not None:
            path = frame.f_code.co_filename
            if not path.startswith(NOT_OURS):
                package = _package(path, self.packages + MODEL_PACKAGES)
                if site is None:
                    if package is None:
                        return None
                    site = f"{package[1]}:{frame.f_lineno}"
                if package is not None and package[0] in self.packages:
                    return site
            frame = frame.f_back
        return None


class _PythonCalls(TorchFunctionMode):
    def __init__(self, count: _Count) -> None:
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        kind, host = self.judge(name, args, kwargs)
        self.count.record(kind)
        previous, self.count.calling = self.count.calling, (name, args)
        try:  # torch runs `func` with this mode off: what it calls inside is not counted again
            out = func(*args, **kwargs)
        finally:
            self.count.calling = previous
        return out if host is None else self.count.place(out, host, args[0] if args else None)

    def judge(self, name: str, args: tuple, kwargs: dict) -> tuple[str | None, bool | None]:
        """(the sync this call is, if any; whether its result is on the host, None to leave it to the ops)."""
        count = self.count
        source_on_host = bool(args) and isinstance(args[0], torch.Tensor) and count.on_host(args[0])
        if name == "to":
            target = args[1] if len(args) > 1 else kwargs.get("device")
            to_host = isinstance(target, str) and target.startswith("cpu")
            device, _, non_blocking, _ = torch._C._nn._parse_to(
                *args[1:], **{k: v for k, v in kwargs.items() if k != "copy"}
            )
            if device is None or non_blocking:  # a change of dtype; a copy that does not wait
                return None, None if device is None else to_host
            if not to_host:
                return ("h2d" if source_on_host else None), False
        if name in COPIES:
            return (None if source_on_host else "cpu" if name == "to" else name), True
        if name in FROM_DATA:
            at = int(name == "new_tensor")  # Tensor.new_tensor(self, data)
            if not isinstance(args[at] if len(args) > at else kwargs.get("data"), torch.Tensor):
                to_device = kwargs.get("device") is not None or (name == "new_tensor" and not source_on_host)
                return ("h2d" if to_device else None), not to_device
        if name in PRINTS:
            return (None if source_on_host else "item" if args[0].dim() == 0 else "cpu"), None
        if name in ("__getitem__", "__setitem__"):  # a list index goes to the device as a tensor
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            return ("h2d" if any(isinstance(i, list) for i in index) else None), None
        if not _tensors(args, kwargs):  # a factory: on the host without a device, or drawing from a CPU generator
            generator = kwargs.get("generator")
            return None, kwargs.get("device") is None or (generator is not None and generator.device.type == "cpu")
        return None, None


class _TorchCalls(TorchDispatchMode):
    def __init__(self, count: _Count) -> None:
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors(args, kwargs)
        on_host = [self.count.on_host(t) for t in inputs]
        if not all(on_host) and self.count.calling[0] not in PRINTS:  # reading the host's own tensors blocks nothing
            mixed = any(host and t.dim() > 0 for t, host in zip(inputs, on_host))  # 0-d ones go as numbers
            self.count.record("h2d" if mixed else self.kind(func, args, kwargs))
        out = func(*args, **kwargs)
        if inputs and all(on_host):
            self.count.place(out, True)
        return out

    def kind(self, func, args: tuple, kwargs: dict) -> str | None:
        op, (name, python_args) = func.overloadpacket, self.count.calling
        if op in (aten.item, aten._local_scalar_dense):
            return SCALAR_READS.get(name, "item")
        if op in (aten.is_nonzero, aten.equal):
            return "bool"
        if op in DATA_SIZED or func is aten.where.default:  # where(mask) is nonzero(mask, as_tuple=True)
            return "nonzero"
        if op is aten.repeat_interleave and func is not aten.repeat_interleave.self_int:
            return None if kwargs.get("output_size") is not None else "nonzero"  # its size is repeats.sum()
        if op in (aten.index, aten.index_put, aten.index_put_) and any(
            i is not None and i.dtype in MASKS for i in args[1]
        ):  # a mask index is nonzero(mask); x[mask] = number is a masked_fill_
            number_fill = name == "__setitem__" and not isinstance(python_args[2], torch.Tensor)
            return None if op is not aten.index and number_fill else "nonzero"
        return None


@contextlib.contextmanager
def count_host_syncs(packages: tuple[str, ...] = ("ssd_pipelines",)) -> Iterator[HostSyncs]:
    """Count, in this thread while open, the host syncs of torch calls made from `packages` (names of the folders
    their files lie in), directly or through transformers or diffusers model code."""
    count = _Count(packages)
    with _PythonCalls(count), _TorchCalls(count):
        yield count.syncs
