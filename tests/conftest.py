import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from gpuknap.engine import Backend, cupy_available, get_backend  # noqa: E402

CUPY_OK, CUPY_WHY = cupy_available()
needs_gpu = pytest.mark.skipif(not CUPY_OK, reason=f"no CuPy GPU backend here: {CUPY_WHY}")


@pytest.fixture(params=["numpy", "numpy-tables", pytest.param("cupy", marks=needs_gpu)])
def backend(request):
    """Every way the batched engine can run: NumPy (block passes), NumPy reading
    per-row option tables (the kernel's data path), and CuPy's CUDA kernel."""
    if request.param == "numpy":
        return get_backend("numpy")
    if request.param == "numpy-tables":
        return Backend("numpy", np, "tables")
    return get_backend("cupy")


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=needs_gpu)])
def xp(request):
    """The array module, NumPy or CuPy."""
    if request.param == "numpy":
        return np
    import cupy
    return cupy
