"""/api/v1/usage: the calling key's quotas, where it stands, and its daily usage."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.common.serializers import REQUEST_ERRORS
from api.selectors.usage import api_key_usage_report
from api.usage_serializers import KeyUsageSerializer, UsageQuerySerializer, usage_body


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
    def get(self, request: Request) -> Response:
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        report = api_key_usage_report(api_key=request.auth, days=query.validated_data["days"], now=timezone.now())
        return Response(KeyUsageSerializer(usage_body(report)).data)
