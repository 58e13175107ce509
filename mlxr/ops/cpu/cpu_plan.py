"""A recorded CPU forward, replayed without the Python that issued it: the CPU's CUDA graph.

A decode step of a small model on the CPU spends as much time in Python (module calls, the
launchers' checks, ctypes argument conversion) as in its kernels (SmolLM2-135M, 2 threads: ~8
of ~18 ms a token). `record(fn)` runs fn once and keeps, in order, every call into the native
libraries (mlxr/ops/cpu/cpu_build.py) with its arguments and every torch op that computes; `replay()`
repeats just those. It is correct when fn's work depends only on the contents of tensors that
stay where they were (static inputs, weights, the KV cache, the tensors fn allocated, which the
plan keeps alive): pointers and shapes are baked in, as in a CUDA graph. The recording refuses
(PlanUnsupported) anything that reads a tensor's value on the host, since that could steer the
Python differently on another step.

Torch ops: a view (output sharing an input's storage) costs nothing and is skipped; an op
writing in place or into `out=` is called again; a constant (an op of no tensor) is restored
from a copy; any other op is called again and its result copied into the tensor it returned
at recording (later ops hold that tensor's pointer).

The libraries' functions are swapped for recorders process-wide while a recording runs, and
other threads may be running models of their own (a server with two models loaded): recordings
take turns (a lock), and a recorder only notes the calls of the thread that is recording."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from mlxr.ops.cpu.cpu_build import loaded_libraries

# Tensor methods that read values on the host: the Python after them may branch on the data.
_HOST_READS = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__",
                         "__array__", "__repr__", "__str__", "__format__", "equal", "allclose"})
# Allocations whose contents fn writes before reading (no need to redo them).
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
_INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ior__", "__iand__"})
# Held while the libraries' functions are swapped: two recordings at once would each restore the
# other's recorders as the originals, and one would stay in place for good.
_RECORDING = threading.Lock()


class PlanUnsupported(RuntimeError):
    """fn does something a replay could not repeat faithfully."""


class NativePlan:
    """The recorded calls of one run of fn, and fn's result (its tensors are rewritten by each replay)."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], Any]] = []
        self.keep: list[torch.Tensor] = []  # every tensor fn made: their memory must stay theirs
        self.result: Any = None
        self.native_calls = 0

    def replay(self) -> None:
        for call in self.calls:
            call()

    # --- recording ---------------------------------------------------------------------------
    def add_native(self, fn: Callable, args: tuple, status: Any) -> None:
        self.native_calls += 1
        if isinstance(status, int) and status == 0:  # a kernel that reports failure by status
            def call() -> None:
                got = fn(*args)
                if got:
                    raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed ({got}) in a CPU plan replay")
            self.calls.append(call)
        else:
            self.calls.append(lambda: fn(*args))

    def add_torch(self, func: Callable, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        outs = _tensors(out)
        self.keep += outs
        inplace = ("out" in kwargs or kwargs.get("inplace") is True or name in _INPLACE_DUNDERS
                   or (name.endswith("_") and not name.startswith("__")))
        if inplace:
            self.calls.append(lambda: func(*args, **kwargs))
            return
        if not outs or name in _UNINITIALIZED:
            return
        sources = _tensors((args, kwargs))
        if not sources:  # a constant (torch.tensor(2.0), zeros): restored from a copy, not made again
            saved = [t.clone() for t in outs]
            self.calls.append(lambda: [dst.copy_(src) for dst, src in zip(outs, saved)])
            return
        inputs = {t.untyped_storage().data_ptr() for t in sources}
        if all(t.untyped_storage().data_ptr() in inputs for t in outs):
            return  # views of the inputs
        def call() -> None:
            for dst, src in zip(outs, _tensors(func(*args, **kwargs))):
                dst.copy_(src)
        self.calls.append(call)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


class _TorchRecorder(TorchFunctionMode):
    def __init__(self, plan: NativePlan) -> None:
        super().__init__()
        self.plan = plan

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HOST_READS:
            raise PlanUnsupported(f"the forward reads a tensor on the host ({name})")
        out = func(*args, **kwargs)
        self.plan.add_torch(func, name, args, kwargs, out)
        return out


class _NativeRecorder:
    """Stands in for a library's function while recording: calls it, notes the recording
    thread's calls (another thread's belong to another model's step)."""

    def __init__(self, fn: Callable, plan: NativePlan) -> None:
        self.fn, self.plan = fn, plan
        self.thread = threading.get_ident()
        self.__name__ = getattr(fn, "__name__", "native")

    def __call__(self, *args):
        status = self.fn(*args)
        # Calls without arguments query the build (its SIMD level): nothing to repeat.
        if args and threading.get_ident() == self.thread:
            self.plan.add_native(self.fn, args, status)
        return status


def record(fn: Callable[[], Any]) -> NativePlan:
    """Run fn once, recording it (under inference mode, as its replays run). Run fn once before:
    a library that loads during the recording has calls the recording cannot see."""
    plan = NativePlan()
    with _RECORDING:
        loaded = len(loaded_libraries())
        patched = _patch_libraries(plan)
        try:
            with _TorchRecorder(plan):  # torch's function modes are per thread
                plan.result = fn()
        finally:
            for lib, name, original in patched:
                setattr(lib, name, original)
    if len(loaded_libraries()) != loaded:
        raise PlanUnsupported("a native library loaded during the recording (run the function once first)")
    plan.keep += _tensors(plan.result)
    return plan


def _patch_libraries(plan: NativePlan) -> list[tuple[ctypes.CDLL, str, Any]]:
    patched = []
    for lib in loaded_libraries():
        for name, value in list(vars(lib).items()):
            if isinstance(value, ctypes._CFuncPtr):
                patched.append((lib, name, value))
                setattr(lib, name, _NativeRecorder(value, plan))
    return patched
