"""``MODELS`` is read as ``name=path`` pairs (a bare path is named after its folder), and a bad
list stops the process at start-up with the variable's name."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference_service.env import env_model_list


def test_models_are_name_path_pairs_or_folders_named_after_themselves(monkeypatch):
    monkeypatch.setenv("MODELS", "small=var/models/tiny, var/models/qwen-0.5b/ ,big=/srv/m/llama")

    assert env_model_list("MODELS") == [("small", "var/models/tiny"), ("qwen-0.5b", "var/models/qwen-0.5b/"),
                                        ("big", "/srv/m/llama")]


def test_unset_models_is_an_empty_list(monkeypatch):
    monkeypatch.delenv("MODELS", raising=False)

    assert env_model_list("MODELS") == []


@pytest.mark.parametrize("value", ["a=x,a=y", "bad name=x", "a/b=x", "a="])
def test_a_duplicate_name_a_name_unfit_for_a_queue_or_a_missing_path_is_refused(monkeypatch, value):
    monkeypatch.setenv("MODELS", value)

    with pytest.raises(ImproperlyConfigured, match="MODELS"):
        env_model_list("MODELS")
