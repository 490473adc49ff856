"""The demo model's data: modules split by path alone, so held-out modules stay held out everywhere."""

from __future__ import annotations

from collections import Counter

from demo_model import code_data
from demo_model.builder import train_tokenizer


def test_a_modules_split_depends_on_its_path_alone_and_holds_some_out():
    keys = [f"pkg{i}/mod{j}.py" for i in range(40) for j in range(25)]
    splits = Counter(code_data.split_of(k) for k in keys)
    assert [code_data.split_of(k) for k in keys] == [code_data.split_of(k) for k in keys]
    # 1,000 keys: 5% test and 3% val, give or take the hash's spread.
    assert 30 <= splits["test"] <= 75 and 15 <= splits["val"] <= 50
    # Splits are part of the contract: the shipped weights were trained without these modules.
    assert [code_data.split_of(k) for k in ("statistics.py", "pprint.py", "warnings.py", "os.py", "ast.py")] == [
        "test", "test", "test", "train", "train"]


def test_corpus_sections_become_documents_keyed_by_module_path():
    docs = code_data.corpus_documents()
    keys = [d.key for d in docs]
    assert keys[0] == "textwrap.py" and "json/decoder.py" in keys and len(keys) == len(set(keys))
    assert all(d.source == "corpus" and d.text.strip() for d in docs)
    assert not any(d.text.startswith("# ---- ") for d in docs)


def test_normalize_drops_control_characters_but_keeps_tabs_and_newlines():
    assert code_data.normalize("a\r\n\tb\x0c\x00c\x1b") == "a\n\tbc"


def test_gather_prefers_the_corpus_copy_and_skips_tests_and_vendored_code():
    docs = code_data.gather()
    by_key = {d.key: d for d in docs}
    assert len(by_key) == len(docs)
    assert by_key["json/decoder.py"].source == "corpus"
    assert any(d.source == "stdlib" for d in docs)
    for d in docs:
        parts = d.key.split("/")
        assert not {"test", "tests", "encodings", "_vendor"} & set(parts[:-1]), d.key
        assert "\r" not in d.text and "\x0c" not in d.text


def test_encoded_documents_are_framed_by_bos_and_eos():
    tok = train_tokenizer(3000)
    docs = code_data.corpus_documents()[:2]
    stream = code_data.encode_documents(tok, docs, bos=1, eos=2)
    assert stream.dtype.name == "uint16"
    assert list(stream).count(1) == 2 and list(stream).count(2) == 2 and stream[0] == 1 and stream[-1] == 2
    first_end = list(stream).index(2)
    assert tok.decode(stream[1:first_end].tolist()) == docs[0].text
