from __future__ import annotations

import json
import shutil

import pytest

from api.common.errors import ServiceUnavailable
from api.serving.tokenization import PromptTokenizer, get_tokenizer


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
    from api.serving import tokenization

    copy = tmp_path / "model"  # a path no test has loaded yet
    shutil.copytree(tiny_model_path, copy)
    settings.MODEL_PATH = str(copy)
    assert tokenization.load_tokenizer_at_start()

    misses = tokenization._load.cache_info().misses
    get_tokenizer()
    assert tokenization._load.cache_info().misses == misses  # already loaded: the request loads nothing


def test_a_failed_warm_up_only_logs(settings, tmp_path, caplog):
    from api.serving import tokenization

    settings.MODEL_PATH = str(tmp_path / "missing")
    assert not tokenization.load_tokenizer_at_start()
    assert "Cannot load the tokenizer" in caplog.text


def _sentencepiece_folder(path) -> str:
    """A model folder whose tokenizer is SentencePiece-style (Llama 2, Mistral): "▁" for a space,
    and byte-fallback pieces ``<0xNN>`` for characters outside the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}, "▁": 259, "h": 260}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                            "bos_token": "<s>", "unk_token": "<unk>"}))
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 64, "vocab_size": len(vocab)}))
    return str(path)


def test_token_bytes_are_the_tokens_own_for_byte_fallback_and_byte_level_tokenizers(tmp_path, tiny_model_path):
    sentencepiece = PromptTokenizer(_sentencepiece_folder(tmp_path))
    ids = sentencepiece.encode_prompt("h →")
    assert [sentencepiece.token_bytes(t) for t in ids] == [b" ", b"h", b" ", b"\xe2", b"\x86", b"\x92"]

    byte_level = PromptTokenizer(str(tiny_model_path))
    assert b"".join(byte_level.token_bytes(t) for t in byte_level.encode_prompt(" h →")[1:]) == " h →".encode()
