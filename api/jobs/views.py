"""/api/v1/jobs: submit, list, inspect, cancel and delete generation jobs."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.common.requests import AuthenticatedRequest
from api.common.serializers import PAGE_NOT_FOUND, REQUEST_ERRORS, ErrorSerializer, paginated_list
from api.jobs.metadata import metadata_filters
from api.jobs.selectors import job_detail, job_get, job_list, job_queue_position
from api.jobs.serializers import (
    JOBS_MAX_PAGE_SIZE,
    JobCreatedSerializer,
    JobCreateSerializer,
    JobDeletedSerializer,
    JobListQuerySerializer,
    JobSerializer,
)
from api.jobs.services.cancel import job_cancel
from api.jobs.services.deletion import job_delete
from api.jobs.services.submission import JobRequest, job_create
from api.keys.quotas import quota_request_rate_state
from api.serving.workers import model_served
from api.system.schema_hooks import IDEMPOTENCY_KEY_SCHEMA

ERRORS = {
    **REQUEST_ERRORS,
    404: OpenApiResponse(ErrorSerializer, description="No such job (or not yours)"),
}


class JobPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = JOBS_MAX_PAGE_SIZE

    def get_page_size(self, request: Request) -> int | None:
        self.page_size = settings.JOBS_PAGE_SIZE
        return super().get_page_size(request)


class JobListCreateView(APIView):
    @extend_schema(
        operation_id="jobs_create",
        summary="Submit a generation job",
        description=(
            "Send exactly one of `prompt` (plain text) or `messages` (chat, rendered with the model's "
            "chat template). Returns 202 with the job id and queue position. With an `Idempotency-Key` "
            "header a retry of the same body returns the original job (200); the same key with a "
            "different body is a 422."
        ),
        request=JobCreateSerializer,
        parameters=[OpenApiParameter("Idempotency-Key", IDEMPOTENCY_KEY_SCHEMA, OpenApiParameter.HEADER,
                                     description="1 to 255 printable ASCII characters, unique per user")],
        responses={
            202: JobCreatedSerializer,
            200: JobCreatedSerializer,
            **ERRORS,
            422: OpenApiResponse(ErrorSerializer, description="Idempotency-Key reused with a different body"),
            429: OpenApiResponse(ErrorSerializer, description="A quota of the key is used up (see Retry-After)"),
        },
    )
    def post(self, request: AuthenticatedRequest) -> Response:
        serializer = JobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        submission = job_create(
            owner=request.user,
            api_key=request.auth,
            request=JobRequest.from_validated(serializer.validated_data),
            idempotency_key=request.headers.get("Idempotency-Key"),
        )
        job = submission.job
        position = submission.queue_position if submission.created else job_queue_position(job=job)
        body = {"id": job.id, "object": "job", "status": job.status, "queue_position": position, "model": job.model,
                "model_served": model_served(job.model), "created_at": job.created_at}
        headers = {"Location": f"/api/v1/jobs/{job.id}"}
        rate = submission.rate_limit or quota_request_rate_state(api_key=request.auth)
        if rate is not None:
            headers.update(rate.headers())
        return Response(
            JobCreatedSerializer(body).data,
            status=status.HTTP_202_ACCEPTED if submission.created else status.HTTP_200_OK,
            headers=headers,
        )

    @extend_schema(
        operation_id="jobs_list",
        summary="List your jobs, newest first",
        description="Each job as GET /jobs/<id> shows it, less its `logprobs` (null here).",
        parameters=[
            JobListQuerySerializer,
            OpenApiParameter("metadata", {"type": "object", "additionalProperties": {"type": "string"}},
                             OpenApiParameter.QUERY, style="deepObject",
                             explode=True, description="Only jobs with these metadata pairs: "
                                                       "`metadata[<key>]=<value>`, once per key, all must match"),
        ],
        responses={200: paginated_list("PaginatedJobList", JobSerializer(many=True)), **REQUEST_ERRORS,
                   404: PAGE_NOT_FOUND},
    )
    def get(self, request: AuthenticatedRequest) -> Response:
        query = JobListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        jobs = job_list(owner=request.user, status=query.validated_data.get("status"),
                        metadata=metadata_filters(request.query_params))
        paginator = JobPagination()
        page = paginator.paginate_queryset(jobs, request, view=self) or []
        return paginator.get_paginated_response(
            JobSerializer([job_detail(job=job, with_logprobs=False) for job in page], many=True).data)


class JobDetailView(APIView):
    @extend_schema(operation_id="jobs_retrieve", summary="A job: status, text so far, usage, timings",
                   responses={200: JobSerializer, **ERRORS})
    def get(self, request: AuthenticatedRequest, job_id: str) -> Response:
        job = job_get(job_id=job_id, owner=request.user)
        return Response(JobSerializer(job_detail(job=job)).data)

    @extend_schema(
        operation_id="jobs_destroy",
        summary="Delete a finished job",
        description=(
            "Clears the job's prompt, messages, output, stop strings and metadata for good, and its "
            "stream; the job is not found afterwards. Its token counts still count towards the key's "
            "quotas and usage. A queued or running job is a 409: cancel it first. The engine workers' "
            "prefix caches may keep the KV state of its prompt (never its text) until they evict it."
        ),
        responses={200: JobDeletedSerializer, **ERRORS,
                   409: OpenApiResponse(ErrorSerializer, description="The job is still queued or running")},
    )
    def delete(self, request: AuthenticatedRequest, job_id: str) -> Response:
        job = job_delete(job_id=job_id, owner=request.user)
        return Response(JobDeletedSerializer({"id": job.id}).data)


class JobCancelView(APIView):
    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job",
        description="A queued job is cancelled at once; a running one stops within about a second.",
        request=None,
        responses={200: JobSerializer, **ERRORS, 409: OpenApiResponse(ErrorSerializer, description="Already finished")},
    )
    def post(self, request: AuthenticatedRequest, job_id: str) -> Response:
        job = job_cancel(job_id=job_id, owner=request.user)
        return Response(JobSerializer(job_detail(job=job)).data)
