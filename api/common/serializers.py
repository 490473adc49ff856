"""What every endpoint's serializers share: strict scalar fields (wrong types are 400s, not
coerced), the refusal of unknown fields, and the error envelope and paging in the OpenAPI schema."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers


def check_text(value: str) -> str:
    """``value``, refused if it holds NUL or is not valid Unicode (a lone surrogate)."""
    if "\x00" in value:
        raise serializers.ValidationError("Null characters are not allowed.", code="null_characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise serializers.ValidationError("Text is not valid Unicode (lone surrogate).", code="invalid_text") from None
    return value


class StrictCharField(serializers.CharField):
    """A string, and only a string (DRF's CharField would turn 123 into "123")."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return check_text(super().to_internal_value(data))


class StrictIntegerField(serializers.IntegerField):
    """An integer, not a bool, a string or a float."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A finite JSON number (int or float), not a bool or a string."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, float) and not math.isfinite(data):
            self.fail("invalid")
        try:
            return super().to_internal_value(data)
        except OverflowError:  # a huge int cannot become a float
            self.fail("invalid")


if TYPE_CHECKING:  # the mixin goes before a Serializer, whose fields and method it uses
    _SerializerBase = serializers.Serializer
else:
    _SerializerBase = object


class RejectUnknownFieldsMixin(_SerializerBase):
    """Unknown keys are an error (a typo like ``max_token`` must not be silently ignored)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {str(unknown[0]): [serializers.ErrorDetail("Unknown field.", code="unknown_field")]}
                )
        return super().to_internal_value(data)


class ErrorDetailSerializer(serializers.Serializer):
    message = serializers.CharField()
    type = serializers.CharField()
    code = serializers.CharField(allow_null=True)
    param = serializers.CharField(allow_null=True)


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


# The answers every authenticated endpoint can give, for its OpenAPI responses.
REQUEST_ERRORS = {
    400: OpenApiResponse(ErrorSerializer, description="Invalid request"),
    401: OpenApiResponse(ErrorSerializer, description="Missing, invalid or revoked API key"),
}
PAGE_NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such page (past the last one)")


def paginated_list(name: str, item: serializers.Serializer) -> serializers.Serializer:
    """A list endpoint's 200 for the OpenAPI schema: the page envelope that DRF's
    PageNumberPagination answers around ``item``s (``item`` is a serializer with ``many=True``)."""
    return inline_serializer(name, {
        "count": serializers.IntegerField(help_text="Items in all pages"),
        "next": serializers.URLField(allow_null=True, help_text="The next page, if any"),
        "previous": serializers.URLField(allow_null=True, help_text="The previous page, if any"),
        "results": item,
    })
