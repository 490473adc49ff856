"""/api/v1/keys: a user's own API keys, listed, and revoked (a leaked key, say) without an operator;
/api/v1/usage: the calling key's quotas, where it stands, and its daily usage.

Keys are created by operators (the admin, ``manage.py create_api_user``): each key carries its own
quotas, so a user who could mint keys could multiply them.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from api.common.requests import AuthenticatedRequest
from api.common.serializers import PAGE_NOT_FOUND, REQUEST_ERRORS, ErrorSerializer, paginated_list
from api.keys.selectors import api_key_list
from api.keys.serializers import (
    KEYS_MAX_PAGE_SIZE,
    ApiKeySerializer,
    KeyListQuerySerializer,
    WebhookSecretSerializer,
    api_key_body,
)
from api.keys.services import api_key_revoke_owned, api_key_rotate_webhook_secret_owned
from api.keys.usage import api_key_usage_report
from api.keys.usage_serializers import KeyUsageSerializer, UsageQuerySerializer, usage_body


class KeyPagination(PageNumberPagination):
    page_size = KEYS_MAX_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = KEYS_MAX_PAGE_SIZE


class ApiKeyListView(APIView):
    @extend_schema(operation_id="keys_list", summary="Your API keys, newest first (revoked ones too)",
                   parameters=[KeyListQuerySerializer],
                   responses={200: paginated_list("PaginatedApiKeyList", ApiKeySerializer(many=True)), **REQUEST_ERRORS,
                              404: PAGE_NOT_FOUND})
    def get(self, request: AuthenticatedRequest) -> Response:
        KeyListQuerySerializer(data=request.query_params).is_valid(raise_exception=True)
        paginator = KeyPagination()
        page = paginator.paginate_queryset(api_key_list(owner=request.user), request, view=self) or []
        body = [api_key_body(key, current=request.auth) for key in page]
        return paginator.get_paginated_response(ApiKeySerializer(body, many=True).data)


class ApiKeyRevokeView(APIView):
    @extend_schema(
        operation_id="keys_revoke",
        summary="Revoke one of your API keys",
        description="From the next request on, the key is refused (401). Revoking a revoked key "
                    "changes nothing. The request's own key may be revoked too.",
        request=None,
        responses={200: ApiKeySerializer, **REQUEST_ERRORS,
                   404: OpenApiResponse(ErrorSerializer, description="No such key (or not yours)")},
    )
    def post(self, request: AuthenticatedRequest, key_id: int) -> Response:
        api_key = api_key_revoke_owned(key_id=key_id, owner=request.user)
        return Response(ApiKeySerializer(api_key_body(api_key, current=request.auth)).data)


class WebhookSecretRotateView(APIView):
    @extend_schema(
        operation_id="keys_webhook_secret_rotate",
        summary="Make a new webhook signing secret for one of your API keys",
        description="The secret that signs the webhooks of the key's jobs (Standard Webhooks, "
                    "`whsec_<base64>`); the old one stops signing at once. Shown once: store it.",
        request=None,
        responses={200: WebhookSecretSerializer, **REQUEST_ERRORS,
                   404: OpenApiResponse(ErrorSerializer, description="No such key (or not yours)")},
    )
    def post(self, request: AuthenticatedRequest, key_id: int) -> Response:
        api_key, secret = api_key_rotate_webhook_secret_owned(key_id=key_id, owner=request.user)
        return Response(WebhookSecretSerializer({"api_key_id": api_key.id, "secret": secret}).data)


class UsageView(APIView):
    @extend_schema(
        operation_id="usage_retrieve",
        summary="Your API key's quotas, what is used of each, and its daily usage",
        description=(
            "Counted as a submission counts them; reading this does not count as a request. "
            "`days` lists the daily usage, newest first: today's counted from the jobs at this read, "
            "earlier days from the daily roll-up."
        ),
        parameters=[UsageQuerySerializer],
        responses={
            200: KeyUsageSerializer,
            **REQUEST_ERRORS,
        },
    )
    def get(self, request: AuthenticatedRequest) -> Response:
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        report = api_key_usage_report(api_key=request.auth, days=query.validated_data["days"], now=timezone.now())
        return Response(KeyUsageSerializer(usage_body(report)).data)
