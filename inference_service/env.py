"""Typed readers for settings from the environment.

Each helper returns the default when the variable is unset or empty and raises
``ImproperlyConfigured`` (naming the variable) when it is set to something unusable, so a typo in a
deployment fails at start-up instead of running with a silently wrong value.
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_given(name: str) -> str | None:
    """The variable exactly as set, blank included; None when it is unset (for checks that must
    tell "set to nothing" from "not set")."""
    return os.environ.get(name)


def env_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use one of {sorted(_TRUE | _FALSE)})")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be >= {minimum}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be >= {minimum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_networks(name: str, default: list[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """A comma-separated list of CIDRs (``10.0.0.0/8,fd00::/8``); a bare address is a /32 or /128."""
    networks = []
    for item in env_list(name, default):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not a network (CIDR) or an address") from None
    return tuple(networks)


def env_json_object(name: str, default: dict[str, Any]) -> dict[str, Any]:
    value = _raw(name)
    if value is None:
        return dict(default)
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object")
    return parsed


MODEL_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def model_name_of(path: str) -> str:
    """A model's default name: its folder's name."""
    return os.path.basename(os.path.normpath(path))


def check_model_name(name: str, *, variable: str) -> str:
    """A model name is part of queue names and URLs: letters, digits, ``.``, ``_`` and ``-``."""
    if not name or not set(name) <= MODEL_NAME_CHARS:
        raise ImproperlyConfigured(f"{variable}: model name {name!r} may only hold letters, digits, '.', '_' and '-'")
    return name


def env_model_list(name: str) -> list[tuple[str, str]]:
    """``name=path`` pairs (a bare path is named after its folder), comma-separated; names unique."""
    models: list[tuple[str, str]] = []
    for item in env_list(name, []):
        model, sep, path = item.partition("=")
        if not sep:
            model, path = model_name_of(item), item
        model, path = check_model_name(model.strip(), variable=name), path.strip()
        if not path:
            raise ImproperlyConfigured(f"{name}: {item!r} names no model folder")
        if any(model == other for other, _ in models):
            raise ImproperlyConfigured(f"{name}: the model name {model!r} appears twice")
        models.append((model, path))
    return models
