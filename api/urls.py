from __future__ import annotations

from django.urls import path
from drf_spectacular.renderers import OpenApiJsonRenderer
from drf_spectacular.views import SpectacularAPIView

from api.jobs.views import JobCancelView, JobDetailView, JobListCreateView
from api.keys.views import ApiKeyListView, ApiKeyRevokeView, UsageView, WebhookSecretRotateView
from api.serving.views import ModelListView
from api.system.views import HealthView, api_docs

urlpatterns = [
    path("jobs", JobListCreateView.as_view(), name="jobs"),
    path("jobs/<uuid:job_id>", JobDetailView.as_view(), name="job-detail"),
    path("jobs/<uuid:job_id>/cancel", JobCancelView.as_view(), name="job-cancel"),
    path("models", ModelListView.as_view(), name="models"),
    path("usage", UsageView.as_view(), name="usage"),
    path("keys", ApiKeyListView.as_view(), name="keys"),
    path("keys/<int:key_id>/revoke", ApiKeyRevokeView.as_view(), name="key-revoke"),
    path("keys/<int:key_id>/webhook_secret", WebhookSecretRotateView.as_view(), name="key-webhook-secret"),
    path("health", HealthView.as_view(), name="health"),
    path(
        "schema",
        SpectacularAPIView.as_view(renderer_classes=[OpenApiJsonRenderer], authentication_classes=[]),
        name="schema",
    ),
    path("docs", api_docs, name="docs"),
]
