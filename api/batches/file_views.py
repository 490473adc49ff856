"""``/v1/files``: OpenAI's Files API for batch inputs and outputs (api/batches/file_services.py).

An upload is ``multipart/form-data`` with ``file`` and ``purpose`` ("batch"). Django's upload
handlers spill it to a temporary file past FILE_UPLOAD_MAX_MEMORY_SIZE; it is checked as it is
read and copied to the storage in chunks. Each user sees only their own files: another user's id
is a 404, as an unknown one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.batches.file_selectors import FileNotFound, file_chunks, file_get, file_list, file_open
from api.batches.file_services import file_create, file_delete
from api.batches.lines import FileTooLarge
from api.batches.objects import file_object, list_object, paging_parameters, query_choice, query_limit
from api.batches.selectors import page_after
from api.common.errors import InvalidRequest
from api.common.requests import AuthenticatedRequest
from api.common.serializers import REQUEST_ERRORS, ErrorSerializer

FILES_PAGE_MAX = 10_000  # OpenAI's limit for GET /v1/files
MULTIPART_OVERHEAD_BYTES = 64 * 1024  # the form's boundaries and its purpose field
_NOT_FOUND = {404: OpenApiResponse(ErrorSerializer, description="No such file of yours")}


class FileListCreateView(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(operation_id="openai_files_create", tags=["openai"], summary="Upload a batch input (JSONL)",
                   request={"multipart/form-data": {"type": "object", "required": ["file", "purpose"], "properties": {
                       "file": {"type": "string", "format": "binary"}, "purpose": {"type": "string", "enum": ["batch"]}}}},
                   responses={200: OpenApiTypes.OBJECT, **REQUEST_ERRORS,
                              413: OpenApiResponse(ErrorSerializer, description="Past FILES_MAX_BYTES or FILES_MAX_LINES")})
    def post(self, request: AuthenticatedRequest) -> Response:
        # The body is on disk already (Django's ASGI handler spools it); refuse a too large one
        # before parsing it.
        if int(request.META.get("CONTENT_LENGTH") or 0) > settings.FILES_MAX_BYTES + MULTIPART_OVERHEAD_BYTES:
            raise FileTooLarge(f"The file is larger than {settings.FILES_MAX_BYTES} bytes.", param="file")
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidRequest("Send the file as the multipart field `file`.", param="file")
        file = file_create(owner=request.user, upload=upload, purpose=str(request.POST.get("purpose", "")))
        return Response(file_object(file))

    @extend_schema(operation_id="openai_files_list", tags=["openai"], summary="Your files (OpenAI's list)",
                   parameters=[*paging_parameters(FILES_PAGE_MAX), OpenApiParameter("purpose", str),
                               OpenApiParameter("order", str, enum=["asc", "desc"])],
                   responses={200: OpenApiTypes.OBJECT, **REQUEST_ERRORS, **_NOT_FOUND})
    def get(self, request: AuthenticatedRequest) -> Response:
        limit = query_limit(request.query_params, default=FILES_PAGE_MAX, maximum=FILES_PAGE_MAX)
        newest_first = query_choice(request.query_params, "order", ("asc", "desc"), "desc") == "desc"
        after = request.query_params.get("after")
        files = file_list(owner=request.user, purpose=request.query_params.get("purpose"))
        cursor = file_get(file_id=after, owner=request.user, param="after") if after else None
        page = page_after(files, after=cursor, limit=limit, newest_first=newest_first)
        return Response(list_object(page, file_object))


class FileDetailView(APIView):
    @extend_schema(operation_id="openai_files_retrieve", tags=["openai"], summary="One of your files",
                   responses={200: OpenApiTypes.OBJECT, **REQUEST_ERRORS, **_NOT_FOUND})
    def get(self, request: AuthenticatedRequest, file_id: str) -> Response:
        return Response(file_object(file_get(file_id=file_id, owner=request.user)))

    @extend_schema(operation_id="openai_files_delete", tags=["openai"], summary="Delete a file and its bytes",
                   responses={200: OpenApiTypes.OBJECT, **REQUEST_ERRORS, **_NOT_FOUND,
                              409: OpenApiResponse(ErrorSerializer, description="The input of a batch still running")})
    def delete(self, request: AuthenticatedRequest, file_id: str) -> Response:
        file = file_delete(file_id=file_id, owner=request.user)
        return Response({"id": file.id, "object": "file", "deleted": True})


class AnyAccept(BaseContentNegotiation):
    """The bytes are sent whatever the client accepts (OpenAI's SDK asks for
    ``application/binary``), and an error is the JSON envelope: the first renderer, always (as
    DRF's documentation's IgnoreClientContentNegotiation)."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> Any:
        return next(iter(parsers), None)

    def select_renderer(self, request: Request, renderers: Iterable[BaseRenderer],
                        format_suffix: str | None = None) -> tuple:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class FileContentView(APIView):
    content_negotiation_class = AnyAccept

    @extend_schema(operation_id="openai_files_content", tags=["openai"], summary="A file's bytes",
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **REQUEST_ERRORS, **_NOT_FOUND})
    def get(self, request: AuthenticatedRequest, file_id: str) -> StreamingHttpResponse:
        file = file_get(file_id=file_id, owner=request.user)
        try:
            handle = file_open(file=file)
        except FileNotFoundError:  # its bytes were removed from the storage behind the service's back
            raise FileNotFound(file_id) from None
        response = StreamingHttpResponse(file_chunks(handle), content_type="application/octet-stream")
        response["Content-Length"] = str(file.bytes)
        response["Content-Disposition"] = f'attachment; filename="{file.id}.jsonl"'
        return response
