"""HTTP through the ASGI application: a request's sync code runs in one hop, on a pooled thread."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.core import signals
from django.http import HttpResponse, StreamingHttpResponse
from django.test import override_settings
from django.urls import path

from inference_service.asgi import application, django_http
from inference_service.asgi_handler import OneHopASGIHandler

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the request runs on a thread of its own
    pytest.mark.usefixtures("consumer_connections_closed"),
]

seen: list[tuple[str, str]] = []  # (what ran, the thread's name)


def _plain(request):
    seen.append(("view", threading.current_thread().name))
    return HttpResponse("plain")


def _streaming(request):
    seen.append(("view", threading.current_thread().name))
    async def parts():
        yield b"one,"
        yield b"two"

    return StreamingHttpResponse(parts())


urlpatterns = [path("plain", _plain), path("streaming", _streaming)]


def _get(app, path_: str) -> dict:
    """GET ``path_`` from the ASGI ``app``: {"status", "headers", "body"}. (Channels'
    HttpCommunicator rejects the body-less closing message of Django's streaming responses.)"""
    scope = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http", "path": path_,
             "raw_path": path_.encode(), "query_string": b"", "root_path": "", "headers": [(b"host", b"localhost")],
             "client": ("127.0.0.1", 1), "server": ("localhost", 80)}
    sent: list[dict] = []

    async def run():
        inbox: asyncio.Queue = asyncio.Queue()
        await inbox.put({"type": "http.request", "body": b""})

        async def send(message):
            sent.append(message)

        await asyncio.wait_for(app(scope, inbox.get, send), timeout=10)

    asyncio.run(run())
    start, chunks = sent[0], sent[1:]
    assert start["type"] == "http.response.start" and not chunks[-1].get("more_body", False)
    return {"status": start["status"], "headers": start["headers"], "body": b"".join(m.get("body", b"") for m in chunks)}


@pytest.fixture
def trace_signals():
    seen.clear()

    def started(**_):
        seen.append(("started", threading.current_thread().name))

    def finished(**_):
        seen.append(("finished", threading.current_thread().name))

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    yield seen
    signals.request_started.disconnect(started)
    signals.request_finished.disconnect(finished)


@override_settings(ROOT_URLCONF=__name__)
@pytest.mark.parametrize("path_, body", [("/plain", b"plain"), ("/streaming", b"one,two")])
def test_signals_and_view_run_on_one_request_thread(trace_signals, path_, body):
    response = _get(application, path_)
    assert response["status"] == 200
    assert response["body"] == body
    # request_started (close_old_connections), the view and request_finished (connections closed
    # or returned to the pool) all touch the same thread's connections, as under WSGI.
    assert [name for name, _ in trace_signals] == ["started", "view", "finished"]
    assert len({thread for _, thread in trace_signals}) == 1
    assert trace_signals[0][1].startswith("django-request")


@override_settings(ROOT_URLCONF=__name__)
def test_requests_reuse_the_pool_threads_instead_of_starting_new_ones(trace_signals):
    handler = OneHopASGIHandler(threads=2)
    for _ in range(10):
        assert _get(handler, "/plain")["status"] == 200
    # Django's handler starts a thread for each request (and one more to join it); names are
    # unique per thread where idents get reused.
    view_threads = {thread for name, thread in trace_signals if name == "view"}
    assert len(view_threads) <= 2


def test_the_pool_size_comes_from_settings(settings):
    assert django_http.threads == settings.WEB_REQUEST_THREADS


def test_the_middleware_still_applies():
    response = _get(application, "/api/v1/models")
    headers = {name.decode().lower(): value.decode() for name, value in response["headers"]}
    assert response["status"] == 401  # DRF ran: no API key
    assert headers["x-frame-options"] == "DENY"  # XFrameOptionsMiddleware
    assert headers["x-content-type-options"] == "nosniff"  # SecurityMiddleware
    assert headers["content-type"].startswith("application/json")


def test_an_unknown_path_is_django_404():
    assert _get(application, "/no-such-page")["status"] == 404


def test_the_admin_login_page_renders_with_its_csrf_cookie_and_its_static_files():
    page = _get(application, "/admin/login/")
    assert page["status"] == 200
    assert b"csrfmiddlewaretoken" in page["body"]
    cookies = [value.decode() for name, value in page["headers"] if name.lower() == b"set-cookie"]
    assert any(cookie.startswith("csrftoken=") for cookie in cookies)
    css = _get(application, "/static/admin/css/base.css")
    assert css["status"] == 200 and b"{" in css["body"]


def test_urls_reversed_in_a_view_carry_the_scripts_root_path():
    from django.urls import reverse

    urls = []

    def view(request):
        urls.append(reverse("prefixed-plain"))
        return HttpResponse("ok")

    handler = OneHopASGIHandler(threads=1)
    scope_path = "/svc/plain"

    async def run():
        scope = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http", "path": scope_path,
                 "raw_path": scope_path.encode(), "query_string": b"", "root_path": "/svc",
                 "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 1), "server": ("localhost", 80)}
        inbox: asyncio.Queue = asyncio.Queue()
        await inbox.put({"type": "http.request", "body": b""})

        async def send(message):
            pass

        await handler(scope, inbox.get, send)

    with override_settings(ROOT_URLCONF=__name__):
        global urlpatterns
        saved = urlpatterns
        urlpatterns = [path("plain", view, name="prefixed-plain")]
        try:
            asyncio.run(run())
        finally:
            urlpatterns = saved
    assert urls == ["/svc/plain"]
