"""``GET /v1/models`` and ``GET /v1/models/<id>``: the models the OpenAI-compatible endpoints take,
in OpenAI's shape, with the service's own fields beside OpenAI's (``available`` and the live
``workers``, as ``/api/v1/models`` shows them; OpenAI's SDKs keep fields they do not know)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.common.errors import ModelNotFound, ServiceUnavailable
from api.common.serializers import REQUEST_ERRORS, ErrorSerializer
from api.serving.catalog import configured_models
from api.serving.selectors import model_list

OWNED_BY = "mlx-inference-service"

MODEL = inline_serializer("OpenAIModel", {
    "id": serializers.CharField(), "object": serializers.CharField(), "created": serializers.IntegerField(),
    "owned_by": serializers.CharField(), "available": serializers.BooleanField(),
    "context_length": serializers.IntegerField(allow_null=True), "workers": serializers.ListField()})


def _models() -> list[dict[str, Any]]:
    """The configured models (jobs can name no other), in OpenAI's shape."""
    try:
        listed = {entry["id"]: entry for entry in model_list()}
    except redis.RedisError:
        raise ServiceUnavailable("Cannot read the workers' heartbeats (Redis is unreachable).") from None
    models = []
    for model in configured_models():
        path = Path(model.path)
        entry = listed[model.name]
        models.append({"id": model.name, "object": "model", "created": int(path.stat().st_mtime) if path.exists() else 0,
                       "owned_by": OWNED_BY, "available": entry["available"],
                       "context_length": entry["context_length"], "workers": entry["workers"]})
    return models


class OpenAIModelListView(APIView):
    @extend_schema(operation_id="openai_models_list", tags=["openai"],
                   summary="The models the OpenAI-compatible endpoints serve (OpenAI's shape)",
                   responses={200: inline_serializer("OpenAIModelList", {
                       "object": serializers.CharField(), "data": serializers.ListField(child=MODEL)}),
                       **REQUEST_ERRORS})
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": _models()})


class OpenAIModelDetailView(APIView):
    @extend_schema(operation_id="openai_models_retrieve", tags=["openai"], summary="One model (OpenAI's shape)",
                   responses={200: MODEL, **REQUEST_ERRORS,
                              404: OpenApiResponse(ErrorSerializer, description="No such model")})
    def get(self, request: Request, model_id: str) -> Response:
        for model in _models():
            if model["id"] == model_id:
                return Response(model)
        raise ModelNotFound(model_id)
