"""Where a CUDA process's device memory is, beyond mlx's own accounting: the device's default
memory pool (mlx allocates with ``cudaMallocAsync`` from it) and the memory CUDA graphs own
(mlx records its kernels into graphs). Read through the driver API (``libcuda.so.1``, which mlx's
CUDA build links), so the figures are this process's. On a machine without CUDA: ``{}``.

    from cuda_memory import cuda_memory
    cuda_memory()  # {"pool_reserved_gb": ..., "pool_reserved_high_gb": ..., "pool_used_high_gb": ...,
                   #  "graph_reserved_gb": ..., "graph_reserved_high_gb": ..., "graph_used_high_gb": ...}
"""

from __future__ import annotations

import ctypes

# CUmemPool_attribute and CUgraphMem_attribute (cuda.h)
_POOL = {"pool_reserved_gb": 5, "pool_reserved_high_gb": 6, "pool_used_gb": 7, "pool_used_high_gb": 8}
_GRAPH = {"graph_used_gb": 0, "graph_used_high_gb": 1, "graph_reserved_gb": 2, "graph_reserved_high_gb": 3}


def cuda_memory(device: int = 0) -> dict[str, float]:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return {}
    out: dict[str, float] = {}
    pool = ctypes.c_void_p()
    if cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device) == 0:
        for name, attr in _POOL.items():
            value = ctypes.c_uint64()
            if cuda.cuMemPoolGetAttribute(pool, attr, ctypes.byref(value)) == 0:
                out[name] = round(value.value / 1e9, 3)
    for name, attr in _GRAPH.items():
        value = ctypes.c_uint64()
        if cuda.cuDeviceGetGraphMemAttribute(device, attr, ctypes.byref(value)) == 0:
            out[name] = round(value.value / 1e9, 3)
    return out
