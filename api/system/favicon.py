"""``/favicon.ico``: the service's icon (api/static/api/favicon.ico), which every browser asks the
host for on every page it has not seen an icon for; the admin's pages also name it in a <link>."""

from __future__ import annotations

from pathlib import Path

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

ICON = Path(__file__).resolve().parent.parent / "static" / "api" / "favicon.ico"


@require_GET
@cache_control(public=True, max_age=86400)
def favicon(request: HttpRequest) -> HttpResponse:
    return HttpResponse(ICON.read_bytes(), content_type="image/x-icon")
