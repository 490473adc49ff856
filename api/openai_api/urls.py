"""The OpenAI-compatible API's Django routes (its completions are Channels consumers, mounted in
api.streaming.routing)."""

from __future__ import annotations

from django.urls import path

from api.batches.file_views import FileContentView, FileDetailView, FileListCreateView
from api.batches.views import BatchCancelView, BatchDetailView, BatchListCreateView
from api.openai_api.views import OpenAIModelDetailView, OpenAIModelListView

urlpatterns = [
    path("models", OpenAIModelListView.as_view(), name="openai-models"),
    path("models/<str:model_id>", OpenAIModelDetailView.as_view(), name="openai-model"),
    path("files", FileListCreateView.as_view(), name="openai-files"),
    path("files/<str:file_id>", FileDetailView.as_view(), name="openai-file"),
    path("files/<str:file_id>/content", FileContentView.as_view(), name="openai-file-content"),
    path("batches", BatchListCreateView.as_view(), name="openai-batches"),
    path("batches/<str:batch_id>", BatchDetailView.as_view(), name="openai-batch"),
    path("batches/<str:batch_id>/cancel", BatchCancelView.as_view(), name="openai-batch-cancel"),
]
