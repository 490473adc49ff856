"""docker-compose.yml, the Dockerfile and .dockerignore: valid against the Compose Specification,
one image built once, health checks, OpenBLAS in the image, no unsafe defaults.

The schema is the Compose Specification's own (tests/schemas/compose-spec.json, vendored from
compose-spec/compose-spec at 170098ba07d9f53c383a41bfd4c5166b0a4529a6, schema/compose-spec.json).
Debian's docker-compose 1.29 is older than keys this file uses, so this test is the gate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft7Validator

from inference_service.deployment import unsafe_setting_errors

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "tests" / "schemas" / "compose-spec.json").read_text())
# Services that run the project's image (the others are postgres and redis).
APP_COMMANDS = ("manage.py", "celery", "inference_service.serve_web")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def app_services(compose) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items()
            if any(part in " ".join(s.get("command", [])) for part in APP_COMMANDS)}


def test_the_compose_file_is_valid_against_the_compose_specification(compose):
    errors = sorted(Draft7Validator(SCHEMA).iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_check_rejects_what_the_specification_does_not_allow():
    validator = Draft7Validator(SCHEMA)
    assert not validator.is_valid({"services": {"web": {"image": "x", "depends_on": 3}}})
    assert not validator.is_valid({"services": {"web": {"image": "x", "buidl": {"context": "."}}}})


def test_one_service_builds_the_image_and_every_app_service_runs_that_image(compose, app_services):
    builders = [name for name, s in compose["services"].items() if "build" in s]
    assert builders == ["migrate"]
    image = compose["services"]["migrate"]["image"]
    assert {s["image"] for s in app_services.values()} == {image}
    for name, service in app_services.items():
        if name != "migrate":
            assert service["pull_policy"] == "never", name
            assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name


def test_web_and_every_engine_worker_have_a_health_check(compose, app_services):
    web = compose["services"]["web"]["healthcheck"]["test"]
    assert "http://127.0.0.1:8000/api/v1/health" in " ".join(web)
    workers = {name: s for name, s in app_services.items() if "run_engine_worker" in s["command"]}
    assert len(workers) == 2
    for name, worker in workers.items():
        assert worker["healthcheck"]["test"] == ["CMD", "python", "manage.py", "check_engine_worker"], name
        assert {"MODEL_PATH", "MODEL_NAME"} <= set(worker["environment"]), name


def _default(value: str) -> str | None:
    """What a ``${VAR:-default}`` value becomes with VAR unset; None for a required ``${VAR:?msg}``."""
    match = re.fullmatch(r"\$\{(\w+)(:-|:\?)(.*)\}", value)
    if match is None:
        return value
    return match[3] if match[2] == ":-" else None


def test_no_app_service_starts_with_a_placeholder_secret_or_any_host(app_services):
    for name, service in app_services.items():
        env = service["environment"]
        assert _default(env["SECRET_KEY"]) is None, f"{name}: SECRET_KEY must be required, not defaulted"
        hosts = [h.strip() for h in _default(env["ALLOWED_HOSTS"]).split(",")]
        assert env["DEBUG"] == "0"
        assert unsafe_setting_errors(debug=False, secret_key=None, allowed_hosts=hosts) == [], name


def test_the_image_has_openblas_and_the_fortran_runtime():
    dockerfile = (ROOT / "Dockerfile").read_text()
    install = next(line for line in dockerfile.replace("\\\n", " ").splitlines() if "apt-get install" in line)
    assert {"libopenblas0-pthread", "libgfortran5"} <= set(install.split())


def test_the_build_context_leaves_out_the_virtualenv_and_local_state():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "var", "*.whl", "**/__pycache__", "bench/results"} <= ignored
