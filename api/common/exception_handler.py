"""The one place errors become HTTP responses: DRF's EXCEPTION_HANDLER, which the consumers call
too, and the project's 404 and 500 handlers.

Every error the API returns has the shape ``{"error": {"message", "type", "code", "param"}}``
(OpenAI's): the domain errors (errors.py) with their own status and code, DRF's own exceptions
(parse errors, 404, 405, throttling, validation) mapped here.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found, server_error
from rest_framework import exceptions as drf
from rest_framework.response import Response
from rest_framework.views import set_rollback

from api.common.errors import DATABASE_UNAVAILABLE_ERRORS, ServiceError, database_unavailable, error_body

logger = logging.getLogger(__name__)


def _flatten_validation(detail: Any, prefix: str | None = None) -> tuple[str, str | None, str]:
    """First (message, param, code) of a nested DRF ValidationError detail."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = None if key == "non_field_errors" else str(key)
            param = f"{prefix}.{name}" if prefix and name else (name or prefix)
            return _flatten_validation(value, param)
    if isinstance(detail, list) and detail:
        first = detail[0]
        if isinstance(first, dict | list):
            index_param = f"{prefix}[0]" if prefix else None
            return _flatten_validation(first, index_param)
        return _flatten_validation(first, prefix)
    message = str(detail) if str(detail) else "Invalid request."
    code = getattr(detail, "code", None) or "invalid"
    text = f"{prefix}: {message}" if prefix else message
    return text, prefix, str(code)


def validation_summary(exc: drf.ValidationError) -> tuple[str, str | None, str]:
    """(message, param, code) of the first error of ``exc``, as the error envelope states it."""
    return _flatten_validation(exc.detail)


_DRF_TYPES: dict[type[drf.APIException], tuple[str, str]] = {
    drf.ParseError: ("invalid_request_error", "invalid_json"),
    drf.UnsupportedMediaType: ("invalid_request_error", "unsupported_media_type"),
    drf.NotAuthenticated: ("invalid_request_error", "missing_api_key"),
    drf.AuthenticationFailed: ("invalid_request_error", "invalid_api_key"),
    drf.PermissionDenied: ("invalid_request_error", "permission_denied"),
    drf.NotFound: ("invalid_request_error", "not_found"),
    drf.MethodNotAllowed: ("invalid_request_error", "method_not_allowed"),
    drf.NotAcceptable: ("invalid_request_error", "not_acceptable"),
    drf.Throttled: ("rate_limit_error", "rate_limit_exceeded"),
}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF EXCEPTION_HANDLER: every error becomes the envelope. A lost database connection is a
    503 (DatabaseUnavailable); unexpected exceptions are logged and answered with a 500 in the same
    envelope (so a client never sees an HTML page)."""
    set_rollback()  # as DRF's own handler: an atomic request must not commit half its work
    if isinstance(exc, DATABASE_UNAVAILABLE_ERRORS):
        exc = database_unavailable(exc, context.get("view").__class__.__name__)
    if isinstance(exc, ServiceError):
        body = error_body(exc.message, error_type=exc.error_type, code=exc.code, param=exc.param)
        return Response(body, status=exc.status_code, headers=exc.headers())
    if isinstance(exc, Http404):
        exc = drf.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = drf.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        return Response(error_body("Request body too large.", error_type="invalid_request_error",
                                   code="request_too_large"), status=413)
    elif isinstance(exc, SuspiciousOperation):  # e.g. too many fields / malformed headers
        return Response(error_body("Bad request.", error_type="invalid_request_error", code="bad_request"), status=400)
    if isinstance(exc, drf.ValidationError):
        message, param, code = _flatten_validation(exc.detail)
        return Response(error_body(message, error_type="invalid_request_error", code=code, param=param), status=400)
    if isinstance(exc, drf.APIException):
        error_type, code = next(
            (value for cls, value in _DRF_TYPES.items() if isinstance(exc, cls)),
            ("invalid_request_error", str(exc.default_code)),
        )
        headers: dict[str, str] = {}
        wait = exc.wait if isinstance(exc, drf.Throttled) else None  # type: ignore[attr-defined]  # drf-stubs omit Throttled.wait
        if wait is not None:
            headers["Retry-After"] = str(int(wait + 0.999))
        if isinstance(exc, drf.NotAuthenticated | drf.AuthenticationFailed):
            headers["WWW-Authenticate"] = 'Bearer realm="api"'
            return Response(error_body(str(exc.detail), error_type=error_type, code=code), status=401, headers=headers)
        return Response(error_body(str(exc.detail), error_type=error_type, code=code), status=exc.status_code, headers=headers)
    logger.exception("Unhandled error in %s", context.get("view").__class__.__name__)
    return Response(error_body("Internal server error.", error_type="server_error", code="internal_error"), status=500)


# The service's API and the OpenAI-compatible one: their errors are always the JSON envelope.
API_PREFIXES = ("/api/", "/v1/")


def json_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler404 for URLs no view matched: API paths get the envelope, other pages Django's."""
    if not request.path.startswith(API_PREFIXES):
        return page_not_found(request, exception or Http404())
    return JsonResponse(
        error_body(f"Unknown URL: {request.path}", error_type="invalid_request_error", code="not_found"), status=404
    )


def json_server_error(request: HttpRequest) -> HttpResponse:
    """handler500: the envelope for API paths, Django's page elsewhere (the admin)."""
    if not request.path.startswith(API_PREFIXES):
        return server_error(request)
    return JsonResponse(error_body("Internal server error.", error_type="server_error", code="internal_error"), status=500)
