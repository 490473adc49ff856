from __future__ import annotations

import json
import shutil

import pytest

from api.errors import ServiceUnavailable
from api.tokenization import get_tokenizer


def test_plain_prompt_starts_with_exactly_one_bos(tiny_model_path):
    tokenizer = get_tokenizer(str(tiny_model_path))
    ids = tokenizer.encode_prompt("Once upon a time")
    bos = tokenizer._tokenizer.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 1


def test_chat_messages_render_with_the_template_and_generation_prompt(tiny_model_path):
    tokenizer = get_tokenizer(str(tiny_model_path))
    ids = tokenizer.encode_messages([{"role": "user", "content": "Hi"}])
    text = tokenizer._tokenizer.decode(ids)
    assert text.count("<|im_start|>") == 2 and text.rstrip().endswith("assistant")
    assert ids.count(tokenizer._tokenizer.bos_token_id) == 1


def test_context_length_comes_from_the_models_config(tiny_model_path, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_path, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((copy / "config.json").read_text())
    config["max_position_embeddings"] = 1234
    (copy / "config.json").write_text(json.dumps(config))

    assert get_tokenizer(str(copy)).info.context_length == 1234
    assert get_tokenizer(str(tiny_model_path)).info.context_length == 4096


def test_tokenizer_is_loaded_once_per_process(tiny_model_path):
    assert get_tokenizer(str(tiny_model_path)) is get_tokenizer(str(tiny_model_path))


def test_missing_model_folder_is_a_service_error_not_a_crash(tmp_path):
    with pytest.raises(ServiceUnavailable):
        get_tokenizer(str(tmp_path / "nope"))


def test_the_web_process_loads_the_tokenizer_before_its_first_request(settings, tiny_model_path, tmp_path):
    from api import tokenization

    copy = tmp_path / "model"  # a path no test has loaded yet
    shutil.copytree(tiny_model_path, copy)
    settings.MODEL_PATH = str(copy)
    assert tokenization.load_tokenizer_at_start()

    misses = tokenization._load.cache_info().misses
    get_tokenizer()
    assert tokenization._load.cache_info().misses == misses  # already loaded: the request loads nothing


def test_a_failed_warm_up_only_logs(settings, tmp_path, caplog):
    from api import tokenization

    settings.MODEL_PATH = str(tmp_path / "missing")
    assert not tokenization.load_tokenizer_at_start()
    assert "Cannot load the tokenizer" in caplog.text
