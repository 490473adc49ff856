"""``/v1/batches``: OpenAI's Batch API over the service's jobs (api/batches/services.py). Each
user sees only their own batches: another user's id is a 404, as an unknown one."""

from __future__ import annotations

from django.core.validators import URLValidator
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from api.batches.lines import BATCH_ENDPOINTS
from api.batches.objects import batch_object, list_object, paging_parameters, query_limit
from api.batches.selectors import batch_get, batch_list
from api.batches.services import COMPLETION_WINDOWS, batch_cancel, batch_create
from api.common.requests import AuthenticatedRequest
from api.common.serializers import REQUEST_ERRORS, ErrorSerializer, RejectUnknownFieldsMixin, StrictCharField
from api.jobs.metadata import MetadataField

BATCHES_PAGE_MAX = 100  # OpenAI's limit for GET /v1/batches
BATCHES_PAGE_DEFAULT = 20
_NOT_FOUND = {404: OpenApiResponse(ErrorSerializer, description="No such batch of yours")}


class BatchCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    input_file_id = StrictCharField()
    endpoint = serializers.ChoiceField(choices=sorted(BATCH_ENDPOINTS))
    completion_window = serializers.ChoiceField(choices=sorted(COMPLETION_WINDOWS))
    metadata = MetadataField(required=False, allow_null=True)
    # Called when the batch ends (OpenAI's SDKs send it through ``extra_body``).
    webhook_url = serializers.CharField(required=False, allow_blank=True, max_length=2048,
                                        validators=[URLValidator(schemes=["http", "https"])])


class BatchListCreateView(APIView):
    @extend_schema(operation_id="openai_batches_create", tags=["openai"], summary="Run a file's requests as a batch",
                   request=BatchCreateSerializer, responses={200: OpenApiTypes.OBJECT, **REQUEST_ERRORS,
                                                             404: OpenApiResponse(ErrorSerializer,
                                                                                  description="No such file of yours")})
    def post(self, request: AuthenticatedRequest) -> Response:
        serializer = BatchCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        batch = batch_create(owner=request.user, api_key=request.auth, input_file_id=data["input_file_id"],
                             endpoint=data["endpoint"], completion_window=data["completion_window"],
                             metadata=data.get("metadata"), webhook_url=data.get("webhook_url") or "")
        return Response(batch_object(batch_get(batch_id=batch.id, owner=request.user)))

    @extend_schema(operation_id="openai_batches_list", tags=["openai"], summary="Your batches, newest first",
                   parameters=paging_parameters(BATCHES_PAGE_MAX),
                   responses={200: OpenApiTypes.OBJECT, **REQUEST_ERRORS, **_NOT_FOUND})
    def get(self, request: AuthenticatedRequest) -> Response:
        limit = query_limit(request.query_params, default=BATCHES_PAGE_DEFAULT, maximum=BATCHES_PAGE_MAX)
        page = batch_list(owner=request.user, after=request.query_params.get("after"), limit=limit)
        return Response(list_object(page, batch_object))


class BatchDetailView(APIView):
    @extend_schema(operation_id="openai_batches_retrieve", tags=["openai"], summary="One of your batches",
                   responses={200: OpenApiTypes.OBJECT, **REQUEST_ERRORS, **_NOT_FOUND})
    def get(self, request: AuthenticatedRequest, batch_id: str) -> Response:
        return Response(batch_object(batch_get(batch_id=batch_id, owner=request.user)))


class BatchCancelView(APIView):
    @extend_schema(operation_id="openai_batches_cancel", tags=["openai"], summary="Cancel a batch",
                   request=None, responses={200: OpenApiTypes.OBJECT, **REQUEST_ERRORS, **_NOT_FOUND,
                                            409: OpenApiResponse(ErrorSerializer, description="The batch has ended")})
    def post(self, request: AuthenticatedRequest, batch_id: str) -> Response:
        batch = batch_cancel(batch_id=batch_id, owner=request.user)
        return Response(batch_object(batch_get(batch_id=batch.id, owner=request.user)))
