"""Array backends: NumPy everywhere, the fused CPU pass where Numba imports and
compiles, CuPy where it imports AND a CUDA device is present.

This is the only module that imports CuPy, and it does so lazily, as it loads
the compiled CPU pass (:mod:`._cpu`, the only module importing Numba):
``import gpuknap`` touches neither.  ``backend="auto"`` (the default) takes
CuPy when it is usable, else the fused CPU pass when Numba is installed
(loaded by the first batch with enough work to pay for loading it; batches
before it, and every batch if Numba fails to load, take the NumPy pass: the
results are bit-identical), else NumPy; ``"numba"`` asks for the fused pass
(or says why it cannot run).  ``"numpy"`` is the plain NumPy pass, the reference the others
are tested against.  The ``GPUKNAP_BACKEND`` environment variable overrides
``"auto"``.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from . import _passes as passes

BACKENDS = ("auto", "numpy", "numba", "cupy")
ENV_VAR = "GPUKNAP_BACKEND"

#: Default working memory on the CPU: a quarter of what is available, at most this.
CPU_DEFAULT_CAP = 2 * 2**30
#: Working memory of one chunk on the CPU (when the limit allows more, the batch is
#: cut into chunks of about this size): a level's arrays then stay in the
#: processor's caches from one pass to the next.  Measured on a 2-core EPYC with
#: 32 MiB of L3 (docs/benchmarks.md): 128 MiB chunks ran the sweep benchmark's
#: passes 1.4x faster than one 2 GiB chunk, and 32 MiB or 512 MiB ones slower.
#: Rows wider than this still run, one chunk each, up to the limit.
CPU_CHUNK_BYTES = 128 * 2**20
#: Share of the free device memory a batch may use on the GPU.
GPU_FREE_SHARE = 0.5
#: Under ``"auto"``, the least work (cells x options) of a batch that loads the fused CPU
#: pass: importing Numba and its cached compiled code takes about half a second, about
#: what NumPy's pass takes for this much work.  Once loaded, every batch takes it.
AUTO_FUSED_WORK = 1 << 28


class BackendUnavailable(ValueError, RuntimeError):
    """The requested backend cannot run here (the message says why).

    A ``ValueError`` like every other refusal of an argument (and, as before,
    a ``RuntimeError``), so ``except ValueError`` catches every bad input."""


@dataclass(frozen=True)
class Backend:
    """An array module plus how one level's min-plus pass runs on it.

    ``mode``: ``"segments"`` (plain xp code, blocks of rows sharing a step),
    ``"tables"`` (plain xp code reading per-row option tables), ``"fused"``
    (the compiled CPU pass of :mod:`._cpu`, NumPy arrays) or ``"cuda"`` (the
    CUDA kernel of :mod:`._kernels`, CuPy only).  All four are bit-identical.
    ``fused_work``: with ``"fused"``, batches of less work (cells x options) take
    the plain NumPy pass until the compiled pass is loaded, and every batch does
    if it fails to load.
    """

    name: str
    xp: Any
    mode: str = "segments"
    fused_work: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.name == "cupy"

    @property
    def uses_tables(self) -> bool:
        return self.mode in ("tables", "cuda")

    @property
    def options_per_cell(self) -> int:
        """Useful options a cell's work limit counts one cell for (:func:`._work.option_weight`):
        NumPy's pass streams every option's temporaries, so a cell costs about options / 4 of
        one at the limit's 4 options; the compiled passes loop options over a cached tile (8.6-13.8x
        NumPy's rate at 64 options, docs/benchmarks.md), about options / 32."""
        return 32 if self.mode in ("fused", "cuda") else 4

    def fused(self, work: Any = 0) -> Any:
        """The compiled CPU pass's module for a batch of ``work`` (cells x options, or a
        function giving it, called only when it decides), or None when the batch takes
        another pass."""
        if self.mode != "fused":
            return None
        if self.fused_work and not _numba_status.cache_info().currsize:
            if (work() if callable(work) else work) < self.fused_work:
                return None
        cpu, _ = _numba_status()
        return cpu

    def pass_level(self, prev: Any, parent: Any, level: Any, tables: tuple | None = None) -> Any:
        """One min-plus pass over every row of ``level``."""
        if self.mode == "fused":
            cpu = self.fused(0)  # loaded already, or the backend asked for by name: no batch too small
            if cpu is not None:
                return cpu.pass_level(prev, parent, level)
        if self.mode == "cuda":
            from ._kernels import minplus_pass
            return minplus_pass(self.xp, prev, parent, tables[0], tables[1], level.width)
        if self.mode == "tables":
            return passes.pass_level_tables(self.xp, prev, parent, tables[0], tables[1], level.width)
        return passes.pass_level_xp(self.xp, prev, parent, level.width, level.segments)

    def to_host(self, array: Any) -> np.ndarray:
        return array.get() if self.is_gpu else np.asarray(array)

    def chunk_bytes(self, limit: int) -> int:
        """The size chunks are cut to under a working-memory ``limit``: the limit on
        the GPU (one large batch), :data:`CPU_CHUNK_BYTES` at most on the CPU."""
        return limit if self.is_gpu else min(limit, CPU_CHUNK_BYTES)

    def default_max_bytes(self) -> int:
        """Working memory a batch may use when ``max_bytes`` is None."""
        if self.is_gpu:
            free, _total = self.xp.cuda.runtime.memGetInfo()
            pool = getattr(self.xp, "get_default_memory_pool", None)
            if pool is not None:  # blocks CuPy's pool keeps from earlier batches are ours to reuse
                free += pool().free_bytes()
            return int(free * GPU_FREE_SHARE)
        return min(CPU_DEFAULT_CAP, available_host_bytes() // 4)


def available_host_bytes() -> int:
    """Memory the machine has available now (MemAvailable), in bytes."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


NUMPY = Backend("numpy", np)
FUSED = Backend("numba", np, "fused")
AUTO_FUSED = Backend("numba", np, "fused", AUTO_FUSED_WORK)


@lru_cache(maxsize=1)
def _cupy_status() -> tuple[Any, str]:
    """``(cupy, "")`` when usable, else ``(None, reason)``."""
    try:
        import cupy  # noqa: PLC0415 - the one lazy import of CuPy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return None, f"CuPy is not installed or failed to import ({exc.__class__.__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"CuPy imports but no CUDA device is usable ({exc.__class__.__name__}: {exc})"
    if count < 1:
        return None, "CuPy imports but no CUDA device is present"
    return cupy, ""


@lru_cache(maxsize=1)
def _numba_status() -> tuple[Any, str]:
    """``(the compiled CPU pass's module, "")`` when it loads and passes a smoke test
    against the NumPy pass, else ``(None, reason)``."""
    try:
        from . import _cpu  # noqa: PLC0415 - Numba is imported only when the pass is used
    except Exception as exc:  # ImportError, or a Numba that does not match NumPy
        return None, f"Numba is not installed or failed to import ({exc.__class__.__name__}: {exc})"
    try:
        prev = np.array([[0.0, 1.0, np.inf, 2.5, 4.0, 0.5]])
        seg = passes.Segment(0, 2, np.array([0, 2], dtype=np.int64), np.array([1.25, 0.5]))
        parent = np.array([0, 0])
        got = _cpu.pass_level(prev, parent, passes._Level(5, [seg]))
        ok = np.array_equal(got, passes.pass_level_xp(np, prev, parent, 5, [seg]))
    except Exception as exc:  # a compiler that fails here
        return None, f"Numba imports but the fused pass does not compile ({exc.__class__.__name__}: {exc})"
    if not ok:
        return None, "Numba's fused pass differs from the NumPy pass on a smoke test"
    passes.FUSED = _cpu  # the single-stage solvers' passes take it too
    return _cpu, ""


def numba_available() -> tuple[bool, str]:
    """Whether the fused CPU pass (Numba) can run here, and if not, why."""
    cpu, reason = _numba_status()
    return cpu is not None, reason


def cupy_available() -> tuple[bool, str]:
    """Whether the CuPy backend can run here, and if not, why."""
    cupy, reason = _cupy_status()
    return cupy is not None, reason


def get_backend(name: "str | Backend | None" = "auto") -> Backend:
    """Resolve a backend name (``"auto"``, ``"numpy"``, ``"cupy"``); a Backend passes through."""
    if isinstance(name, Backend):
        return name
    if name is None:
        name = "auto"
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        env = os.environ.get(ENV_VAR, "").strip()
        if env and env != "auto":
            if env not in BACKENDS:
                raise ValueError(f"{ENV_VAR} must be one of {BACKENDS}, got {env!r}")
            name = env
    if name == "numpy":
        return NUMPY
    if name == "numba":
        cpu, reason = _numba_status()
        if cpu is None:
            raise BackendUnavailable(f"backend 'numba' is unavailable: {reason}")
        return FUSED
    cupy, reason = _cupy_status()
    if cupy is not None:
        return Backend("cupy", cupy, "cuda")
    if name == "cupy":
        raise BackendUnavailable(f"backend 'cupy' is unavailable: {reason}")
    if importlib.util.find_spec("numba") is not None:  # loaded by the first chunk that pays for it
        return AUTO_FUSED
    return NUMPY
