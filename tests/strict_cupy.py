"""A strict stand-in for CuPy on the CPU, for tests only: not a GPU test.

The CuPy path has never run on hardware (no GPU in CI), so the glue around it
(uploads, readouts, the kernel's launch and its arguments, the benchmark
scripts' CUDA calls) would otherwise first run on a lent GPU with minutes to
spare.  This module plays CuPy's part on the CPU, as strictly as CuPy is where
it matters:

- its arrays refuse implicit conversion to NumPy (``np.asarray(x)`` raises
  ``TypeError`` as CuPy's do) and refuse NumPy arrays as operands, index
  arrays or kernel arguments; ``.get()`` / ``asnumpy`` are the only way back;
- :class:`RawKernel` compiles the CUDA source itself for the CPU (a small CUDA
  shim, ``g++``), runs it over the whole launch grid with CUDA's ``unsigned
  int`` block and thread indices, and checks every argument against the
  kernel's C signature (array dtypes, C-contiguity, exact scalar types) and
  the launch against CUDA's grid and block limits;
- ``cuda.runtime``, ``cuda.Device``, ``cuda.Event`` and ``get_elapsed_time``
  answer as CuPy's do (times are the CPU's, meaningless as GPU numbers).

What it cannot show: real device memory limits, timing, or the CUDA
compiler's own view of the source (tests/engine/test_kernel_source.py and a
GPU run cover those).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time

import numpy as np
import pytest

CXX = shutil.which("g++") or shutil.which("c++")
#: Skips a test (or a parameter) where no C++ compiler can build kernels for the stand-in.
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler to build CUDA kernels for the strict CuPy "
                               "stand-in")
#: Free and total device memory the stand-in reports.
FREE_BYTES, TOTAL_BYTES = 1 << 30, 2 << 30

__version__ = "strict-stand-in"
float64, float32, int64, int32, uint8, bool_ = np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_
inf, nan, newaxis = np.inf, np.nan, np.newaxis


def _refuse(what: object) -> TypeError:
    return TypeError(f"Unsupported type {type(what)} (the strict CuPy stand-in refuses NumPy arrays, "
                     "as CuPy does: upload with cupy.asarray)")


def _unwrap(x):
    """The NumPy array behind a stand-in array; scalars pass; NumPy arrays are refused."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        raise _refuse(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    return x


def _wrap(x):
    return ndarray(x) if isinstance(x, np.ndarray) else x


def _key(key):
    if isinstance(key, tuple):
        return tuple(_key(k) for k in key)
    return _unwrap(key)


class ndarray:  # noqa: N801 - CuPy's name
    """An array "on the device": a NumPy array only this module can see."""

    __array_ufunc__ = None  # NumPy's operators hand over to ours, which refuse NumPy arrays
    __array_priority__ = 1000

    def __init__(self, a: np.ndarray):
        self._a = a

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    itemsize = property(lambda self: self._a.itemsize)
    T = property(lambda self: ndarray(self._a.T))
    data = property(lambda self: MemoryPointer(self))

    def get(self, stream=None, order="C", out=None):
        return np.array(self._a, order=order)

    def __repr__(self):
        return f"strict_cupy.ndarray({self._a!r})"

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(np.asarray(v)) for v in self._a)

    def __getitem__(self, key):
        return _wrap(np.asarray(self._a[_key(key)]))

    def __setitem__(self, key, value):
        self._a[_key(key)] = _unwrap(value)

    def __int__(self):
        return int(self._a)

    def __float__(self):
        return float(self._a)

    def __bool__(self):
        return bool(self._a)

    def item(self):
        return self._a.item()

    def tolist(self):
        return self._a.tolist()

    def copy(self, order="C"):
        return ndarray(self._a.copy(order=order))

    def astype(self, dtype, copy=True, **kwargs):
        return ndarray(self._a.astype(dtype, copy=copy, **kwargs))

    def reshape(self, *shape, **kwargs):
        return ndarray(self._a.reshape(*shape, **kwargs))

    def ravel(self, order="C"):
        return ndarray(self._a.ravel(order=order))

    def fill(self, value):
        self._a.fill(value)


def _method(name):
    def call(self, *args, **kwargs):
        return _wrap(np.asarray(getattr(self._a, name)(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})))
    return call


for _name in ("sum", "min", "max", "argmin", "argmax", "any", "all", "cumsum", "mean"):
    setattr(ndarray, _name, _method(_name))


def _operator(name):
    def op(self, *other):
        return _wrap(np.asarray(getattr(self._a, name)(*(_unwrap(o) for o in other))))
    return op


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift",
              "lt", "le", "gt", "ge", "eq", "ne", "neg", "pos", "abs", "invert"):
    for _form in ("__%s__", "__r%s__", "__i%s__"):
        if hasattr(np.ndarray, _form % _name):
            setattr(ndarray, _form % _name, _operator(_form % _name))
ndarray.__hash__ = None


class MemoryPointer:
    """``ndarray.data``: what the copy rate of ``scripts/bench_gpu.py`` uses."""

    def __init__(self, array: ndarray):
        self.array = array
        self.ptr = array._a.ctypes.data

    def copy_from_device_async(self, src: "MemoryPointer", size: int, stream=None) -> None:
        if not isinstance(src, MemoryPointer):
            raise TypeError(f"copy_from_device_async needs a MemoryPointer, got {type(src)}")
        ctypes.memmove(self.ptr, src.ptr, int(size))

    copy_from_device = copy_from_device_async


def _function(name):
    real = getattr(np, name)

    @functools.wraps(real)
    def call(*args, **kwargs):
        out = kwargs.get("out")
        if out is not None and not isinstance(out, ndarray):
            raise _refuse(out)
        got = real(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        return out if out is not None else _wrap(np.asarray(got) if isinstance(got, np.generic) else got)
    return call


def asarray(a, dtype=None, order=None, **kwargs):
    """Upload (a copy; NumPy arrays are welcome here, as in CuPy)."""
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return ndarray(np.array(a, dtype=dtype, order=order or "K"))


array = asarray


def ascontiguousarray(a, dtype=None):
    if not isinstance(a, ndarray):
        raise _refuse(a)
    return ndarray(np.ascontiguousarray(a._a, dtype=dtype))


def asnumpy(a, stream=None, order="C", out=None):
    return a.get() if isinstance(a, ndarray) else np.asarray(a, order=order)


def concatenate(arrays, axis=0, out=None, dtype=None):
    for a in arrays:
        if not isinstance(a, ndarray):
            raise _refuse(a)
    return ndarray(np.concatenate([a._a for a in arrays], axis=axis, dtype=dtype))


class _MemoryPool:
    """CuPy's default memory pool: nothing is kept here."""

    def free_bytes(self) -> int:
        return 0

    def used_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        pass


_POOL = _MemoryPool()


def get_default_memory_pool():
    return _POOL


def get_array_module(*args):
    import sys
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def __getattr__(name):
    if callable(getattr(np, name, None)) and not isinstance(getattr(np, name), type):
        return _function(name)
    raise AttributeError(f"the strict CuPy stand-in has no {name!r}")


# ---------------------------------------------------------------- the CUDA runtime

class _Runtime:
    @staticmethod
    def getDeviceCount():  # noqa: N802 - CuPy's names
        return 1

    @staticmethod
    def memGetInfo():  # noqa: N802
        return FREE_BYTES, TOTAL_BYTES

    @staticmethod
    def getDeviceProperties(device):  # noqa: N802
        return {"name": b"strict CuPy stand-in (CPU)", "totalGlobalMem": TOTAL_BYTES, "multiProcessorCount": 1,
                "maxGridSize": (2**31 - 1, 65535, 65535), "maxThreadsPerBlock": 1024}


class _Device:
    def __init__(self, device=0):
        self.id = int(device)

    def synchronize(self):
        pass

    def use(self):
        pass


class _Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):
        if self.at is None:
            raise RuntimeError("cudaErrorInvalidResourceHandle: the event was never recorded")


def _elapsed(start: _Event, end: _Event) -> float:
    """Milliseconds between two recorded events, as CuPy's ``get_elapsed_time``."""
    if start.at is None or end.at is None:
        raise RuntimeError("cudaErrorInvalidResourceHandle: an event was never recorded")
    return (end.at - start.at) * 1e3


class cuda:  # noqa: N801 - CuPy's namespace
    runtime = _Runtime
    Device = _Device
    Event = _Event
    get_elapsed_time = staticmethod(_elapsed)


# ---------------------------------------------------------------- kernels

_SHIM = r"""
#include <cstring>
struct uint3_ { unsigned int x, y, z; };
static uint3_ blockIdx, blockDim, threadIdx, gridDim;
#define __global__
#define __device__ static inline
#define __restrict__
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline double __dadd_rn(double a, double b) { volatile double s = a + b; return s; }
"""

#: C parameter types the stand-in can pass, and the dtype or scalar type each takes.
_ARRAYS = {"double": np.float64, "float": np.float32, "long long": np.int64, "int": np.int32,
           "unsigned char": np.uint8}
_SCALARS = {"double": (np.float64, ctypes.c_double), "long long": (np.int64, ctypes.c_longlong),
            "int": (np.int32, ctypes.c_int)}


def _parameters(source: str, name: str) -> list[tuple[str, bool]]:
    """``(C type, is a pointer)`` of each parameter of kernel ``name`` in ``source``."""
    found = re.search(r"void\s+" + re.escape(name) + r"\s*\(([^)]*)\)", source)
    if found is None:
        raise ValueError(f"kernel {name!r} not found in the source")
    params = []
    for text in found.group(1).split(","):
        text = re.sub(r"\b(const|__restrict__|volatile)\b", " ", text)
        pointer = "*" in text
        words = text.replace("*", " ").split()[:-1]  # drop the parameter's name
        params.append((" ".join(words), pointer))
    return params


@functools.lru_cache(maxsize=None)
def _compile(source: str, name: str):
    """The kernel built for the CPU: ``(library, parameters)``."""
    if CXX is None:
        raise RuntimeError("no C++ compiler: the strict CuPy stand-in cannot build kernels")
    params = _parameters(source, name)
    decl = ", ".join(f"{'const ' if p else ''}{t}{'*' if p else ''} a{i}" for i, (t, p) in enumerate(params))
    call = ", ".join(f"a{i}" for i in range(len(params)))
    driver = f"""
extern "C" void launch_{name}(unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz, {decl}) {{
    gridDim.x = gx; gridDim.y = gy; gridDim.z = gz; blockDim.x = bx; blockDim.y = by; blockDim.z = bz;
    for (unsigned int z = 0; z < gz; ++z) for (unsigned int y = 0; y < gy; ++y) for (unsigned int x = 0; x < gx; ++x)
      for (unsigned int tz = 0; tz < bz; ++tz) for (unsigned int ty = 0; ty < by; ++ty)
        for (unsigned int tx = 0; tx < bx; ++tx) {{
          blockIdx.x = x; blockIdx.y = y; blockIdx.z = z; threadIdx.x = tx; threadIdx.y = ty; threadIdx.z = tz;
          {name}({call});
        }}
}}
"""
    text = _SHIM + source + driver
    tag = hashlib.sha1(text.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), f"strict_cupy_{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    lib = os.path.join(folder, f"{name}_{tag}.so")
    if not os.path.exists(lib):
        src = os.path.join(folder, f"{name}_{tag}_{os.getpid()}.cpp")
        with open(src, "w") as fh:
            fh.write(text)
        tmp = lib + f".{os.getpid()}"
        subprocess.run([CXX, "-O2", "-ffp-contract=off", "-fpermissive", "-w", "-shared", "-fPIC", src, "-o", tmp],
                       check=True)
        os.replace(tmp, lib)
    return ctypes.CDLL(lib), params


def _dims(value, what: str) -> tuple[int, int, int]:
    dims = tuple(value) if isinstance(value, tuple) else (value,)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and d >= 1 for d in dims):
        raise ValueError(f"{what} must be 1 to 3 positive integers, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


class RawKernel:
    """CuPy's ``RawKernel(code, name)``, run on the CPU after strict checks."""

    def __init__(self, code: str, name: str, options=(), backend="nvrtc", **kwargs):
        self.code, self.name = code, name

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        lib, params = _compile(self.code, self.name)
        g, b = _dims(grid, "grid"), _dims(block, "block")
        if g[0] > 2**31 - 1 or g[1] > 65535 or g[2] > 65535:
            raise ValueError(f"grid {g} over CUDA's limits (2**31 - 1, 65535, 65535)")
        if b[0] * b[1] * b[2] > 1024 or b[2] > 64:
            raise ValueError(f"block {b} over CUDA's limits (1024 threads, z <= 64)")
        if len(args) != len(params):
            raise TypeError(f"kernel {self.name} takes {len(params)} arguments, got {len(args)}")
        c_args = []
        for i, (arg, (ctype, pointer)) in enumerate(zip(args, params)):
            if pointer:
                if not isinstance(arg, ndarray):
                    raise _refuse(arg) if isinstance(arg, np.ndarray) else TypeError(
                        f"argument {i} of {self.name} ({ctype}*) needs a device array, got {type(arg)}")
                if arg.dtype != _ARRAYS[ctype]:
                    raise TypeError(f"argument {i} of {self.name} is {ctype}* but the array is {arg.dtype}")
                if not arg._a.flags.c_contiguous:
                    raise ValueError(f"argument {i} of {self.name} is not C-contiguous: the kernel would read it "
                                     "as if it were")
                c_args.append(ctypes.c_void_p(arg._a.ctypes.data))
            else:
                want, c_type = _SCALARS[ctype]
                if type(arg) is not want:
                    raise TypeError(f"argument {i} of {self.name} is {ctype}: pass {want.__name__}, "
                                    f"not {type(arg).__name__}")
                c_args.append(c_type(arg))
        dims = [ctypes.c_uint(d) for d in g + b]
        getattr(lib, f"launch_{self.name}")(*dims, *c_args)


def backend():
    """The CuPy backend of gpuknap (uploads, the CUDA kernel, readouts) on this stand-in."""
    import sys

    from gpuknap.engine import Backend
    return Backend("cupy", sys.modules[__name__], "cuda")


def cpu_kernel(source: str, name: str, grid, block, arrays_and_scalars):
    """Run kernel ``name`` of ``source`` in place on NumPy arrays and scalars (with every
    check of :class:`RawKernel`)."""
    args = [ndarray(a) if isinstance(a, np.ndarray) else a for a in arrays_and_scalars]
    RawKernel(source, name)(grid, block, tuple(args))
