"""Tensors handed to Horovod, recorded from its Python entry points.

Every public collective of ``horovod.torch`` (``allreduce``, ``allreduce_async_``,
``grouped_allreduce``, ``broadcast_``, ``allgather``, ``alltoall``,
``reducescatter``, and ``DistributedOptimizer``, which uses them) reaches
Horovod's C++ core through one of the private functions of
``horovod.torch.mpi_ops`` named in :data:`ENTRY_POINTS`; the public functions
look them up in the module's globals at each call, so wrapping those names
reaches every caller.  The wrapper calls the original and then writes one
APP_TENSOR record per tensor (hvprof_record_tensor: the same per-thread
buffers and the same cost as an MPI record): enqueue time, bytes, element
count, dtype, Horovod's reduction op, broadcast root, process set and the
tensor's output address folded to 32 bits (hvprof_format.h
``hvprof_fold_ptr``), which is the receive buffer of a single-tensor
MPI_Allreduce or MPI_Bcast that Horovod makes for it.

Names are Horovod's own (``horovod/torch/mpi_ops_v2.cc`` GetOpName): the
operation prefix, then the user's name, or ``noname.<handle>``; a grouped
operation's tensors are ``<base>_<i>of<n>``.  They are the names Horovod's
timeline uses.  Each name is given an id the first time it is seen, by the
library (hooks/names.c: one id space per process, shared with the TensorFlow
kernels' records of hooks/tf/kernels.cc), which appends it to
``raw/rank-R.tensors`` (one JSON string per line; line i is id i; read back
by profiler.formats.raw.read_tensor_names) with one write: it is on disk as
soon as a record can refer to it, so a rank that dies keeps its names.

Nothing here may change what the application sees: the original's result and
exceptions pass through untouched, and a failure of the recording is reported
once on stderr and then ignored.

Each entry point is wrapped by ``profiler._fastrec.Hook`` (the same hook in C,
given this module's argument positions and state) when the extension is
built, else (or with HOROVOD_PROFILE_FASTREC=0) by the Python hook of
:func:`_wrap`; both write the same records (tests/test_tensor_hooks.py).  The C hook costs
a fraction of the Python one (figures: docs/validation.md).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from time import monotonic as _monotonic
from types import ModuleType
from typing import Any, Callable

from profiler._env import read
from profiler.collect import selfcost
from profiler.collect.selfcost import close as _close
from profiler.collect.selfcost import sample as _sample
from profiler.collect.selfcost import start as _start
from profiler.collect.selfcost import wall as _wall

__all__ = ["TARGET", "ENTRY_POINTS", "patch_module", "unpatch_module", "TORCH_DTYPES",
           "REDUCE_OPS", "tensors_recorded"]

TARGET = "horovod.torch.mpi_ops"
_WRAPPED = "__hvprof_wrapped__"

#: private entry point -> (name prefix, grouped, then the positions of its
#: arguments: output (None: Horovod allocates it), root_rank, op, name, process_set)
ENTRY_POINTS: dict[str, tuple[str, bool, int | None, int | None, int | None, int, int]] = {
    "_allreduce_async": ("allreduce", False, 1, None, 3, 2, 6),
    "_grouped_allreduce_async": ("grouped_allreduce", True, 1, None, 3, 2, 6),
    "_allgather_async": ("allgather", False, None, None, None, 2, 3),
    "_grouped_allgather_async": ("grouped_allgather", True, None, None, None, 2, 3),
    "_broadcast_async": ("broadcast", False, 1, 2, None, 3, 4),
    "_alltoall_async": ("alltoall", False, None, None, None, 4, 5),
    "_reducescatter_async": ("reducescatter", False, None, None, 3, 2, 4),
    "_grouped_reducescatter_async": ("grouped_reducescatter", True, None, None, 3, 2, 4),
}

#: torch dtype name -> hvprof dtype code (the NCCL codes of hvprof_format.h)
TORCH_DTYPES: dict[str, int] = {
    "int8": 64, "uint8": 65, "bool": 65, "int32": 66, "int64": 68, "float16": 70,
    "float32": 71, "float64": 72, "bfloat16": 73,
}
#: Horovod ReduceOp value (Average 0, Sum 1, Adasum 2, Min 3, Max 4, Product 5)
#: -> hvprof redop code (hvprof_format.h HVPROF_REDOPS)
REDUCE_OPS: dict[int, int] = {0: 15, 1: 1, 2: 255, 3: 3, 4: 4, 5: 2}

_lock = threading.Lock()
_ids: dict[str, int] = {}
_name_fn: Any = None  # native hvprof_tensor_name_id, resolved once
_record: Any = None  # native hvprof_record_tensor, resolved once
_now: Any = None
_warned = False
_count = 0
# handle -> (time.monotonic() at enqueue, name): the tensors this process
# handed to Horovod through the Python hooks that may still be waiting;
# entries whose handle has left Horovod's _handle_map (synchronized) are
# dropped by oldest_pending() (the C hook keeps its own table, read there too)
_pending: dict[Any, tuple[float, str]] = {}
PRUNE_AT = 4096
_prune_at = PRUNE_AT
_module: ModuleType | None = None


def tensors_recorded() -> int:
    """APP_TENSOR records this process wrote (for tests and the cost line)."""
    return _count + (int(_fast.count()) if _fast else 0)


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"profiler: warning: {message}", file=sys.stderr)


def _library() -> bool:
    """Resolve the native functions once; False when profiling is off.

    profiler._fastrec (a CPython extension: ~0.1 us a record) when it was
    built, else the same exports through ctypes (~4 us)."""
    global _record, _now
    if _record is None:
        mod = sys.modules.get("profiler.collect.native")
        lib = mod.loaded() if mod is not None else None  # type: ignore[attr-defined]
        if lib is None:
            _record = False
            return False
        try:
            # a compiled extension: no source for the import graph to follow
            _fastrec = importlib.import_module("profiler._fastrec")
            if _fastrec.available():
                _record, _now = _fastrec.record, _fastrec.now
                return True
        except ImportError:
            pass
        rec = mod.function("hvprof_record_tensor", lib)  # type: ignore[union-attr]
        now = mod.function("hvprof_now", lib)  # type: ignore[union-attr]
        if rec is None or now is None:
            _record = False
            return False
        _now = now

        def record(t0: int, *rest: int) -> int:  # the _fastrec signature
            return int(rec(t0, now(), *rest))

        _record = record
    return _record is not False


def _name_id(name: str) -> int:
    """The id of `name`: the library's (hvprof_tensor_name_id, one id space
    with the TensorFlow kernels' records), which writes its line the first
    time; cached here by name."""
    global _name_fn
    got = _ids.get(name)
    if got is not None:
        return got
    with _lock:
        got = _ids.get(name)
        if got is None:
            if _name_fn is None:  # the first name of this process (a forked child starts over)
                _name_fn = sys.modules["profiler.collect.native"].function(  # type: ignore[attr-defined]
                    "hvprof_tensor_name_id")
            raw = name.encode("utf-8", "replace")  # the names file is UTF-8 JSON
            got = int(_name_fn(raw, len(raw))) if _name_fn is not None else -1
            if got < 0:
                raise OSError("no raw file open, or its names file cannot be written")
            _ids[name] = got
        return got


def _after_fork() -> None:
    """A forked child writes its own raw file: its names start over (the
    library's table too: hooks/names.c)."""
    _ids.clear()


os.register_at_fork(after_in_child=_after_fork)


_DTYPES: dict[Any, tuple[int, int]] = {}


def _dtype_info(tensor: Any) -> tuple[int, int]:
    """(the format's code of the tensor's dtype (0: unknown), bytes per
    element), cached in _DTYPES by dtype."""
    dtype = tensor.dtype
    info = _DTYPES[dtype] = (TORCH_DTYPES.get(str(dtype).rpartition(".")[2], 0),
                             int(tensor.element_size()))
    return info


def _emit(t0: int, name: str, tensor: Any, output: Any, root: int, redop: int,
          ps: int) -> None:
    global _count
    n = int(tensor.numel())
    info = _DTYPES.get(tensor.dtype)
    if info is None:
        info = _dtype_info(tensor)
    code, size = info
    try:
        ptr = int(output.data_ptr()) if output is not None else 0
    except Exception:
        ptr = 0
    _record(t0, n * size, n, _name_id(name), root, code, size, redop, ps, ptr)
    _count += 1


def _process_set(ps: Any) -> int:
    try:
        return int(getattr(ps, "process_set_id", 0) or 0)
    except (TypeError, ValueError):
        return 0


_fast: Any = None  # profiler._fastrec once configured; False: the Python hooks


def fast_hooks_wanted() -> bool:
    """HOROVOD_PROFILE_FASTREC: 1 (the default) = the C hooks where built; 0 =
    the Python hooks (the same records, more cost: a fallback and the tests'
    reference)."""
    return bool(read("HOROVOD_PROFILE_FASTREC"))


def fast_module() -> Any:
    """profiler._fastrec, configured with this module's state, or None (not
    built, the library not loaded, or HOROVOD_PROFILE_FASTREC=0)."""
    global _fast
    if _fast is None:
        _fast = False
        if fast_hooks_wanted():
            try:
                # a compiled extension: no source for the import graph to follow
                mod = importlib.import_module("profiler._fastrec")
                if mod.available() and hasattr(mod, "Hook"):
                    mod.configure(_ids, _name_id, REDUCE_OPS, _DTYPES, _dtype_info, _warn_once)
                    mod.sampling(selfcost.MEASURE_FIRST, selfcost.SAMPLE_EVERY)
                    selfcost.count_elsewhere(mod.calls, lambda: sum(mod.work_ns()))
                    _fast = mod
                    _use_torch_fields(mod)
            except ImportError:
                pass
    return _fast or None


FIELDS_NAME = "libhvprof_torch.so"  # setup.py TORCH_FIELDS_NAME
_fields_reason: str | None = "not tried"


def fields_reason() -> str | None:
    """Why the C hook reads tensors through Python rather than through
    PyTorch's field reader (profiler/_ext/torch_fields.cc); None when it
    uses the reader."""
    return _fields_reason


def _probe_tensors(torch: Any) -> list[Any]:
    """Tensors the field reader must read as Python does: every dtype the
    records know and one they do not, a view with an offset, an empty
    tensor, a Parameter."""
    dtypes = [getattr(torch, n) for n in TORCH_DTYPES if hasattr(torch, n)]
    dtypes += [d for d in (getattr(torch, "complex64", None),) if d is not None]
    probes = [torch.zeros(3, dtype=d) for d in dtypes]
    probes += [torch.zeros(4, 5)[1:, 2:], torch.zeros(0), torch.zeros(2, 0, 3),
               torch.nn.Parameter(torch.ones(7, dtype=torch.float64))]
    return probes


def _use_torch_fields(mod: Any) -> None:
    """Let the C hook read tensors through PyTorch's field reader, when it
    was built (setup.py) for the PyTorch this process runs and reads every
    probe tensor (:func:`_probe_tensors`) exactly as the Python calls do;
    else keep the reason (:func:`fields_reason`; in the rank's self_cost)."""
    global _fields_reason
    from profiler.collect.native import packaged

    torch = sys.modules.get("torch")
    path = packaged(FIELDS_NAME)
    if torch is None:
        _fields_reason = "PyTorch is not imported"
    elif not os.path.isfile(path):
        _fields_reason = f"{FIELDS_NAME} was not built"
    else:
        try:
            built = mod.torch_fields_load(path)
            if built != torch.__version__:
                _fields_reason = f"built for PyTorch {built}, running {torch.__version__}"
            else:
                table: dict[int, tuple[int, int]] = {}
                for t in _probe_tensors(torch):
                    got = mod.torch_fields_probe(t)
                    want = (int(t.numel()), int(t.data_ptr()))
                    info = _DTYPES.get(t.dtype) or _dtype_info(t)
                    if got is None or (got[0], got[2]) != want \
                            or table.setdefault(got[1], info) != info:
                        _fields_reason = f"reads a {t.dtype} tensor otherwise than Python"
                        break
                else:
                    mod.torch_fields_use((torch.Tensor, torch.nn.Parameter), table)
                    _fields_reason = None
        except (OSError, RuntimeError, TypeError, ValueError) as exc:
            _fields_reason = f"{FIELDS_NAME} did not load ({exc})"
    selfcost.note("tensor_fields", "PyTorch's field reader" if _fields_reason is None
                  else f"Python calls: {_fields_reason}")


def _wrap(fname: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    prefix, grouped, out_i, root_i, op_i, name_i, ps_i = ENTRY_POINTS[fname]
    fast = fast_module()
    if fast is not None:
        hook: Callable[..., Any] = fast.Hook(orig, fname, prefix, grouped, out_i, root_i, op_i,
                                             name_i, ps_i)
        return hook
    tensor_key = "tensors" if grouped else "tensor"
    out_key = "outputs" if grouped else "output"
    # an argument absent from the entry point's signature: past any positional
    none_i = 1 << 30
    out_j = none_i if out_i is None else out_i
    root_j = none_i if root_i is None else root_i
    op_j = none_i if op_i is None else op_i

    @functools.wraps(orig)
    def entry(*args: Any, **kwargs: Any) -> Any:
        if _record is False or (_record is None and not _library()):
            return orig(*args, **kwargs)
        measured = _sample()
        w0 = _wall() if measured else 0
        t0 = _now()
        before = _wall() - w0 if measured else 0
        handle = orig(*args, **kwargs)  # Horovod's result and errors, untouched
        opened = _start() if measured else None
        try:
            na = len(args)
            tensors = args[0] if na else kwargs.get(tensor_key)
            outputs = (args[out_j] if out_j < na else kwargs.get(out_key)) \
                if out_i is not None else None
            name = args[name_i] if name_i < na else kwargs.get("name")
            base = f"{prefix}.{name}" if name else f"{prefix}.noname.{handle}"
            root = (args[root_j] if root_j < na else kwargs.get("root_rank", -1)) \
                if root_i is not None else -1
            op = (args[op_j] if op_j < na else kwargs.get("op")) if op_i is not None else None
            redop = REDUCE_OPS.get(int(op), 255) if op is not None else 0
            ps_arg = args[ps_i] if ps_i < na else kwargs.get("process_set")
            ps = 0 if ps_arg is None else _process_set(ps_arg)
            _pending[handle] = (_monotonic(), base)
            if len(_pending) > _prune_at:  # bounded without a watchdog too
                _prune()
            if grouped and tensors is not None:
                n = len(tensors)
                outs = list(outputs) if outputs is not None else [None] * n
                for i, t in enumerate(tensors):
                    _emit(t0, f"{base}_{i + 1}of{n}", t, outs[i], -1, redop, ps)
            else:
                _emit(t0, base, tensors, outputs, int(root), redop, ps)
        except Exception as exc:  # never break the training loop
            _warn_once(f"tensor record failed ({fname}): {exc}")
        if opened is not None:
            _close(opened, before)
        return handle

    setattr(entry, _WRAPPED, orig)
    return entry


def _prune() -> None:
    """Drop the handed-back handles of the Python hooks' table; the next
    pruning at twice what is left (amortised constant time per tensor,
    whatever Horovod keeps pending)."""
    global _prune_at
    oldest_pending()
    _prune_at = max(PRUNE_AT, 2 * len(_pending))


def oldest_pending() -> tuple[float, str] | None:
    """(seconds, name) of the oldest tensor this process handed to Horovod that
    Horovod has not handed back (still in horovod.torch.mpi_ops._handle_map:
    not synchronized yet); None when there is none.  For the hang watchdog:
    a tensor that one rank never submits keeps the others waiting here while
    every MPI call completes."""
    live = getattr(_module, "_handle_map", None)
    if live is None:
        return None
    oldest: tuple[float, str] | None = _fast.oldest_pending(live) if _fast else None
    now = _monotonic()
    for handle, (t, name) in list(_pending.items()):
        if handle not in live:
            _pending.pop(handle, None)
        elif oldest is None or now - t > oldest[0]:
            oldest = (now - t, name)
    return oldest


def patch_module(module: ModuleType) -> int:
    """Wrap the entry points of horovod.torch.mpi_ops.  Idempotent; returns the
    number newly wrapped."""
    global _module
    _module = module
    n = 0
    for fname in ENTRY_POINTS:
        orig = module.__dict__.get(fname)
        if orig is None or getattr(orig, _WRAPPED, None) is not None:
            continue
        setattr(module, fname, _wrap(fname, orig))
        n += 1
    return n


def unpatch_module(module: ModuleType) -> None:
    """Undo :func:`patch_module` (for tests)."""
    for fname in ENTRY_POINTS:
        orig = getattr(module.__dict__.get(fname), _WRAPPED, None)
        if orig is not None:
            setattr(module, fname, orig)
