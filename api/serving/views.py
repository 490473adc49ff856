"""``GET /api/v1/models``: the configured models, each with the live workers serving it."""

from __future__ import annotations

import redis
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.common.errors import ServiceUnavailable
from api.common.serializers import REQUEST_ERRORS, ErrorSerializer
from api.serving.selectors import model_list


class ModelListView(APIView):
    @extend_schema(
        operation_id="models_list",
        summary="The configured models, each available or not, with the live workers serving it",
        responses={200: inline_serializer("ModelList", {"object": serializers.CharField(), "data": serializers.ListField()}),
                   401: REQUEST_ERRORS[401],
                   503: OpenApiResponse(ErrorSerializer, description="The workers' heartbeats cannot be read (Redis is down)")},
    )
    def get(self, request: Request) -> Response:
        try:
            models = model_list()
        except redis.RedisError:
            raise ServiceUnavailable("Cannot read the workers' heartbeats (Redis is unreachable).") from None
        return Response({"object": "list", "data": models})
