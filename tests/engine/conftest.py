"""The engine's tests run every backend, the fused CPU pass (Numba) included."""
import numpy as np
import pytest
import strict_cupy

from gpuknap.engine import Backend, cupy_available, get_backend, numba_available

CUPY_OK, CUPY_WHY = cupy_available()
NUMBA_OK, NUMBA_WHY = numba_available()
needs_numba = pytest.mark.skipif(not NUMBA_OK, reason=f"no fused CPU pass here: {NUMBA_WHY}")
needs_gpu = pytest.mark.skipif(not CUPY_OK, reason=f"no CuPy GPU backend here: {CUPY_WHY}")


@pytest.fixture(params=["numpy", "numpy-tables", pytest.param("numba", marks=needs_numba),
                        pytest.param("strict-cupy", marks=strict_cupy.needs_cxx), pytest.param("cupy", marks=needs_gpu)])
def backend(request):
    """Every way the batched engine can run: NumPy (block passes), NumPy reading
    per-row option tables (the kernel's data path), the fused CPU pass, the CuPy
    path on the strict CPU stand-in (tests/strict_cupy.py) and CuPy's CUDA kernel."""
    if request.param == "numpy":
        return get_backend("numpy")
    if request.param == "numpy-tables":
        return Backend("numpy", np, "tables")
    if request.param == "strict-cupy":
        return strict_cupy.backend()
    return get_backend(request.param)
