import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import strict_cupy  # noqa: E402

from gpuknap.engine import Backend, cupy_available, get_backend  # noqa: E402

CUPY_OK, CUPY_WHY = cupy_available()
needs_gpu = pytest.mark.skipif(not CUPY_OK, reason=f"no CuPy GPU backend here: {CUPY_WHY}")


@pytest.fixture(params=["numpy", "numpy-tables", pytest.param("strict-cupy", marks=strict_cupy.needs_cxx),
                        pytest.param("cupy", marks=needs_gpu)])
def backend(request):
    """Every way the batched engine can run: NumPy (block passes), NumPy reading
    per-row option tables (the kernel's data path), the CuPy path on the strict
    CPU stand-in (tests/strict_cupy.py) and CuPy's CUDA kernel."""
    if request.param == "numpy":
        return get_backend("numpy")
    if request.param == "numpy-tables":
        return Backend("numpy", np, "tables")
    if request.param == "strict-cupy":
        return strict_cupy.backend()
    return get_backend("cupy")


@pytest.fixture(params=["numpy", pytest.param("strict-cupy", marks=strict_cupy.needs_cxx),
                        pytest.param("cupy", marks=needs_gpu)])
def xp(request):
    """The array module: NumPy, the strict CuPy stand-in, or CuPy."""
    if request.param == "numpy":
        return np
    if request.param == "strict-cupy":
        return strict_cupy
    import cupy
    return cupy
