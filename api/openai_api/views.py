"""``GET /v1/models`` and ``GET /v1/models/<id>``: the model the OpenAI-compatible endpoints take,
in OpenAI's shape (``/api/v1/models`` is the service's own view, with the workers serving each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.openai_api.requests import ModelNotFound, served_model
from api.serializers import REQUEST_ERRORS, ErrorSerializer

OWNED_BY = "mlx-inference-service"

MODEL = inline_serializer("OpenAIModel", {
    "id": serializers.CharField(), "object": serializers.CharField(), "created": serializers.IntegerField(),
    "owned_by": serializers.CharField()})


def _model() -> dict[str, Any]:
    path = Path(settings.MODEL_PATH)
    created = int(path.stat().st_mtime) if path.exists() else 0
    return {"id": served_model(), "object": "model", "created": created, "owned_by": OWNED_BY}


class OpenAIModelListView(APIView):
    @extend_schema(operation_id="openai_models_list", tags=["openai"],
                   summary="The model the OpenAI-compatible endpoints serve (OpenAI's shape)",
                   responses={200: inline_serializer("OpenAIModelList", {
                       "object": serializers.CharField(), "data": serializers.ListField(child=MODEL)}),
                       **REQUEST_ERRORS})
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": [_model()]})


class OpenAIModelDetailView(APIView):
    @extend_schema(operation_id="openai_models_retrieve", tags=["openai"], summary="One model (OpenAI's shape)",
                   responses={200: MODEL, **REQUEST_ERRORS,
                              404: OpenApiResponse(ErrorSerializer, description="No such model")})
    def get(self, request: Request, model_id: str) -> Response:
        if model_id != served_model():
            raise ModelNotFound(model_id)
        return Response(_model())
