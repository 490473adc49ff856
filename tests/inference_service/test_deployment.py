"""The service refuses to start outside DEBUG with a placeholder SECRET_KEY or ALLOWED_HOSTS=*."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference_service.deployment import refuse_unsafe_settings, unsafe_setting_errors

ROOT = Path(__file__).resolve().parents[2]
SAFE_KEY = "k" * 50


@pytest.mark.parametrize("key", ["change-me-in-production", "", "   "])
def test_a_placeholder_or_empty_secret_key_is_refused_outside_debug(key):
    errors = unsafe_setting_errors(debug=False, secret_key=key, allowed_hosts=["localhost"])
    assert len(errors) == 1 and errors[0].startswith("SECRET_KEY is ")


def test_allowed_hosts_star_is_refused_outside_debug():
    errors = unsafe_setting_errors(debug=False, secret_key=SAFE_KEY, allowed_hosts=["localhost", "*"])
    assert len(errors) == 1 and "ALLOWED_HOSTS contains '*'" in errors[0]


def test_debug_allows_the_placeholders():
    assert unsafe_setting_errors(debug=True, secret_key="change-me-in-production", allowed_hosts=["*"]) == []


def test_a_real_key_and_named_hosts_pass_and_an_unset_key_keeps_the_developer_default():
    assert unsafe_setting_errors(debug=False, secret_key=SAFE_KEY, allowed_hosts=["api.example.com"]) == []
    assert unsafe_setting_errors(debug=False, secret_key=None, allowed_hosts=["localhost"]) == []


def test_the_error_names_every_unsafe_setting_at_once():
    with pytest.raises(ImproperlyConfigured, match=r"SECRET_KEY is the placeholder .*ALLOWED_HOSTS contains"):
        refuse_unsafe_settings(debug=False, secret_key="change-me-in-production", allowed_hosts=["*"])


def _manage_check(**env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "ALLOWED_HOSTS", "DEBUG")}
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def test_manage_py_stops_at_settings_load_with_the_compose_placeholders():
    refused = _manage_check(DEBUG="0", SECRET_KEY="change-me-in-production", ALLOWED_HOSTS="*")
    assert refused.returncode != 0
    assert "Refusing to start with DEBUG off" in refused.stderr
    assert "SECRET_KEY is the placeholder 'change-me-in-production'" in refused.stderr
    assert "ALLOWED_HOSTS contains '*'" in refused.stderr

    allowed = _manage_check(DEBUG="0", SECRET_KEY=SAFE_KEY, ALLOWED_HOSTS="localhost")
    assert allowed.returncode == 0, allowed.stderr
