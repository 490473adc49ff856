"""Chat messages on a model whose tokenizer has no chat template, or whose template rejects them:
a 400 that says so, never a 500 (any mlx-lm folder can be MODEL_PATH, base models included)."""

from __future__ import annotations

import json
import shutil

import pytest

from api.models import Job
from tests.api.jobs.test_validation import assert_error

pytestmark = pytest.mark.django_db

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def _model_copy(tiny_model_path, tmp_path, chat_template: str | None):
    """The tiny model's tokenizer files (a web process needs no weights) with another template."""
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_path, copy, ignore=shutil.ignore_patterns("*.safetensors", "chat_template.jinja"))
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if chat_template is not None:
        config["chat_template"] = chat_template
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    return copy


def test_messages_to_a_model_without_a_chat_template_is_400_and_names_the_way_out(api_client, settings,
                                                                                  tiny_model_path, tmp_path):
    settings.MODEL_PATH = str(_model_copy(tiny_model_path, tmp_path, chat_template=None))
    error = assert_error(api_client.post("/api/v1/jobs", CHAT, format="json"), 400, param="messages",
                         code="chat_template_missing")
    assert "no chat template" in error["message"] and "prompt" in error["message"]
    assert not Job.objects.exists()
    # A plain prompt still works on that model.
    assert api_client.post("/api/v1/jobs", {"prompt": "Hi", "max_tokens": 4}, format="json").status_code == 202


def test_messages_the_models_template_rejects_are_400_with_the_templates_reason(api_client, settings,
                                                                               tiny_model_path, tmp_path):
    # Templates often raise for a conversation they do not support (roles that must alternate).
    template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}{% endfor %}")
    settings.MODEL_PATH = str(_model_copy(tiny_model_path, tmp_path, chat_template=template))
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_tokens": 4}
    error = assert_error(api_client.post("/api/v1/jobs", body, format="json"), 400, param="messages",
                         code="invalid_messages")
    assert "System role not supported" in error["message"]
    assert not Job.objects.exists()
    assert api_client.post("/api/v1/jobs", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                           format="json").status_code == 202



def test_a_chat_template_that_does_not_compile_is_the_models_fault_a_503(api_client, settings, tiny_model_path,
                                                                        tmp_path, caplog):
    settings.MODEL_PATH = str(_model_copy(tiny_model_path, tmp_path, chat_template="{% for m in messages %}"))
    error = assert_error(api_client.post("/api/v1/jobs", CHAT, format="json"), 503)
    assert "chat template" in error["message"]
    assert "does not compile" in caplog.text  # logged for the operator
    assert not Job.objects.exists()
