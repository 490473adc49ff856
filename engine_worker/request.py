"""The seed's ``request`` module (``from vllm_mlx.request import ...``): the request types, which
live in :mod:`engine_worker.common.request`."""

from __future__ import annotations

from engine_worker.common.request import Request, RequestOutput, RequestStatus, SamplingParams

__all__ = ["Request", "RequestOutput", "RequestStatus", "SamplingParams"]
