"""The OpenAI-compatible API's Django routes (its completions are Channels consumers, mounted in
api.routing)."""

from __future__ import annotations

from django.urls import path

from api.openai_api.views import OpenAIModelDetailView, OpenAIModelListView

urlpatterns = [
    path("models", OpenAIModelListView.as_view(), name="openai-models"),
    path("models/<str:model_id>", OpenAIModelDetailView.as_view(), name="openai-model"),
]
