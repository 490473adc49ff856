"""/api/v1/health, the OpenAPI schema and its offline docs page."""

from __future__ import annotations

from typing import Any

import redis
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.common.redis_client import get_redis
from api.serving.selectors import model_live_workers

_HEALTH = inline_serializer("Health", {"status": serializers.CharField(), "checks": serializers.DictField()})


class HealthView(APIView):
    """Liveness of the parts a job needs: 200 when all are up, else 503 with the failing ones."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(operation_id="health", summary="Database, Redis and engine-worker health", auth=[],
                   responses={200: _HEALTH, 503: OpenApiResponse(_HEALTH, description="A part is down: its check says which")})
    def get(self, request: Request) -> Response:
        checks = {"database": _check_database(), "redis": _check_redis()}
        checks["workers"] = _check_workers() if checks["redis"]["ok"] else {"ok": False, "live": 0}
        healthy = all(check["ok"] for check in checks.values())
        return Response({"status": "ok" if healthy else "unavailable", "checks": checks}, status=200 if healthy else 503)


def _check_workers() -> dict[str, object]:
    """Up when a worker is live; ``models`` says how many serve each configured model (a model
    with none takes jobs, which wait for a worker)."""
    try:
        per_model = model_live_workers()
    except redis.RedisError as exc:
        return {"ok": False, "live": 0, "error": type(exc).__name__}
    live = sum(per_model.values())
    return {"ok": live > 0, "live": live,
            "models": {name: {"live": count, "served": count > 0} for name, count in per_model.items()}}


def _check_database() -> dict[str, object]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True}
    except DatabaseError as exc:
        return {"ok": False, "error": type(exc).__name__}


def _check_redis() -> dict[str, object]:
    try:
        get_redis().ping()
        return {"ok": True}
    except redis.RedisError as exc:
        return {"ok": False, "error": type(exc).__name__}


def _ref_name(schema: dict[str, Any] | None) -> str:
    """A short type name for a schema: its component name, or its type."""
    if not schema:
        return ""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if schema.get("type") == "array":
        return f"array of {_ref_name(schema.get('items'))}"
    return str(schema.get("type") or "object")


def _operation_rows(schema: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for path, methods in schema.get("paths", {}).items():
        for method, op in methods.items():
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json", {})
            rows.append({
                "method": method.upper(),
                "path": path,
                "summary": op.get("summary", ""),
                "description": op.get("description", ""),
                "parameters": [
                    {"name": p["name"], "where": p["in"], "required": p.get("required", False),
                     "type": _ref_name(p.get("schema"))}
                    for p in op.get("parameters", [])
                ],
                "request": _ref_name(body.get("schema")),
                "responses": [
                    {"code": code, "description": r.get("description", ""),
                     "type": _ref_name(r.get("content", {}).get("application/json", {}).get("schema"))}
                    for code, r in op.get("responses", {}).items()
                ],
            })
    return rows


def _component_rows(schema: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        required = set(component.get("required", []))
        fields = [
            {"name": field, "type": _ref_name(spec) if "$ref" in spec or "type" in spec else "any",
             "required": field in required, "description": spec.get("description", ""),
             "constraints": ", ".join(f"{k}={spec[k]}" for k in ("minimum", "maximum", "maxLength", "minLength",
                                                                  "enum") if k in spec)}
            for field, spec in component.get("properties", {}).items()
        ]
        rows.append({"name": name, "fields": fields})
    return rows


def api_docs(request: HttpRequest) -> HttpResponse:
    """The API reference rendered on the server from the OpenAPI schema: no JavaScript and no
    CDN, so it works without internet access."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return render(
        request,
        "api/docs.html",
        {"info": schema.get("info", {}), "operations": _operation_rows(schema), "components": _component_rows(schema)},
    )
