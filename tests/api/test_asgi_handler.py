"""HTTP through the ASGI application: Django's middleware and view run in one thread hop."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from asgiref.sync import SyncToAsync
from channels.testing import HttpCommunicator

from inference_service.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)  # the request runs on a thread of its own


def _request(path: str, method: str = "GET") -> tuple[dict, int]:
    """(response, SyncToAsync calls made while serving it)."""
    real_call = SyncToAsync.__call__
    calls = 0

    async def counting(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        return await real_call(self, *args, **kwargs)

    async def run():
        communicator = HttpCommunicator(application, method, path, headers=[(b"host", b"localhost")])
        return await communicator.get_response(timeout=10)

    with mock.patch.object(SyncToAsync, "__call__", counting):
        response = asyncio.run(run())
    return response, calls


def test_a_request_takes_three_thread_hops_not_one_per_middleware_hook():
    response, hops = _request("/no-such-page")
    assert response["status"] == 404
    # request_started signal, the middleware chain with the view, response.close(). Django's own
    # handler makes one per process_request/process_response of each of the seven middleware.
    assert hops <= 3, hops


def test_the_middleware_still_applies():
    response, _ = _request("/api/v1/models")
    headers = {name.decode().lower(): value.decode() for name, value in response["headers"]}
    assert response["status"] == 401  # DRF ran: no API key
    assert headers["x-frame-options"] == "DENY"  # XFrameOptionsMiddleware
    assert headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware
    assert headers["content-type"].startswith("application/json")
