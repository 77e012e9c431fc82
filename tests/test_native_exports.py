"""profiler.collect.native.EXPORTS, the one ctypes face of libhvprof.so, against
the library itself: every name in the table is exported, every exported
``hvprof_*`` function is in the table or in C_ONLY (with its reason), and each
declared signature matches the C prototype in hooks/."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from profiler.collect import native

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "hooks"

# C type of a prototype -> the ctypes type the table must declare
C_TYPES: dict[str, object] = {
    "void": None,
    "int": ctypes.c_int,
    "const char *": ctypes.c_char_p,
    "char *": ctypes.c_char_p,  # a caller's buffer (create_string_buffer)
    "hvprof_callback": ctypes.c_void_p,  # a CFUNCTYPE's address
    "uint64_t": ctypes.c_uint64,
    "int64_t": ctypes.c_int64,
    "uint32_t": ctypes.c_uint32,
    "int32_t": ctypes.c_int32,
    "size_t": ctypes.c_size_t,
}
_PROTO = re.compile(r"HVPROF_EXPORT\s+([\w\s\*]+?)\s*\b(hvprof_\w+)\s*\(([^)]*)\)", re.S)


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """The hvprof_* functions the installed library exports (nm -D --defined-only)."""
    nm = shutil.which("nm")
    assert nm is not None, "nm (binutils) is needed: the library is built with it"
    out = subprocess.run([nm, "-D", "--defined-only", native.library_path()], check=True,
                         capture_output=True, text=True).stdout
    names = {f[2] for f in (line.split() for line in out.splitlines())
             if len(f) == 3 and f[1] in "Tt" and f[2].startswith("hvprof_")}
    assert names, out
    return names


def _norm(c_type: str) -> str:
    return re.sub(r"\s*\*\s*", " *", " ".join(c_type.split())).strip()


def prototypes() -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, parameter types) of every HVPROF_EXPORT hvprof_* in hooks/."""
    out: dict[str, tuple[str, list[str]]] = {}
    for src in sorted([*HOOKS.glob("*.c"), *HOOKS.glob("*.h")]):
        for ret, name, params in _PROTO.findall(src.read_text()):
            types = []
            for p in params.split(","):
                p = " ".join(p.split())
                if p and p != "void":
                    types.append(_norm(re.sub(r"\s*\b\w+$", "", p)))  # drop the name
            out[name] = (_norm(ret), types)
    return out


def test_table_names_are_exported(exported: set[str]) -> None:
    missing = sorted(set(native.EXPORTS) - exported)
    assert not missing, f"in native.EXPORTS but not exported by the library: {missing}"
    stale = sorted(set(native.C_ONLY) - exported)
    assert not stale, f"in native.C_ONLY but not exported by the library: {stale}"


def test_every_export_is_declared_or_c_only(exported: set[str]) -> None:
    both = sorted(set(native.EXPORTS) & set(native.C_ONLY))
    assert not both, f"both in EXPORTS and C_ONLY: {both}"
    undeclared = sorted(exported - set(native.EXPORTS) - set(native.C_ONLY))
    assert not undeclared, ("exported hvprof_* functions neither in native.EXPORTS nor in "
                            f"native.C_ONLY (with a reason): {undeclared}")
    assert all(reason.strip() for reason in native.C_ONLY.values())


def test_signatures_match_the_c_prototypes(exported: set[str]) -> None:
    protos = prototypes()
    assert exported <= set(protos), f"no HVPROF_EXPORT prototype in hooks/ for " \
                                    f"{sorted(exported - set(protos))}"
    for name, (restype, argtypes, who) in native.EXPORTS.items():
        ret, params = protos[name]
        assert ret in C_TYPES and all(p in C_TYPES for p in params), (name, ret, params)
        assert restype is C_TYPES[ret], (name, ret, restype)
        assert list(argtypes) == [C_TYPES[p] for p in params], (name, params, argtypes)
        assert who.strip(), name


def test_function_declares_the_table() -> None:
    lib = native.load()
    for name, (restype, argtypes, _) in native.EXPORTS.items():
        fn = native.function(name, lib)
        assert fn is not None, name
        assert fn.restype is restype and tuple(fn.argtypes) == argtypes, name
    fns = native.Functions(lib)
    assert fns.now is not None and int(fns.now()) > 0
    with pytest.raises(AttributeError):
        fns.nccl_flush  # noqa: B018 - C only: not in the table
    with pytest.raises(KeyError):
        native.function("hvprof_nccl_flush", lib)
