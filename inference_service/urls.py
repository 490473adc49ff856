from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from api.dashboard.views import CacheEntryEvictView, engine_dashboard, engine_dashboard_data
from api.system.favicon import favicon
from api.system.metrics_view import metrics

urlpatterns = [
    # Before admin.site.urls, whose catch-all would otherwise answer these paths.
    path("admin/engine/", admin.site.admin_view(engine_dashboard), name="engine-dashboard"),
    path("admin/engine/data.json", admin.site.admin_view(engine_dashboard_data), name="engine-dashboard-data"),
    path("admin/engine/cache/evict", CacheEntryEvictView.as_view(), name="engine-cache-evict"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    path("v1/", include("api.openai_api.urls")),  # OpenAI-compatible (completions: api.streaming.routing)
    path("metrics", metrics, name="metrics"),  # Prometheus
    path("favicon.ico", favicon, name="favicon"),  # what browsers ask every page's host for
]

handler404 = "api.common.exception_handler.json_not_found"
handler500 = "api.common.exception_handler.json_server_error"
