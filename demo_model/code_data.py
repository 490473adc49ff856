"""Python source for training and evaluating the demo model, split by module path.

A *document* is one module: each section of the shipped ``corpus.txt`` (``# ---- json/decoder.py
----``), a ``.py`` file of the running Python's standard library, or optionally one of its
site-packages. Its split (train, val or test) depends only on its key (the module path), so every
machine and Python version puts a module in the same split, and a module held out when the
shipped model was trained is held out here too. Where the corpus and the standard library both
have a module, the corpus's copy is used.

Text is normalized before use: ``\\r\\n`` becomes ``\\n`` and other control characters (form
feeds, ...) are dropped, so the model never learns to emit them.
"""

from __future__ import annotations

import hashlib
import re
import site
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

Split = Literal["train", "val", "test"]

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
_SECTION = re.compile(r"^# ---- (\S+\.py) ----\n", re.M)
# Percent of modules held out: [0, TEST_PERCENT) test, then VAL_PERCENT more for validation.
TEST_PERCENT = 5
VAL_PERCENT = 3
# Left out: codec tables and generated help text (not idiomatic code); test suites (CPython's is
# most of its library where installed, absent on most Linux distributions, and its assertion
# runs teach a small model to loop); copies of other projects vendored into packages (they may
# hold standard-library modules, which must stay in their own split).
_SKIP_PARTS = frozenset({"site-packages", "dist-packages", "encodings", "pydoc_data", "__pycache__",
                         "test", "tests", "idle_test", "lib2to3", "_vendor", "vendor", "_vendored",
                         "vendored", "_distutils", "extern", "_extern"})
MAX_FILE_BYTES = 300_000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Document:
    key: str  # module path: "json/decoder.py" (corpus, stdlib) or "site/numpy/linalg.py"
    text: str
    source: str  # "corpus", "stdlib" or "site"


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def split_of(key: str) -> Split:
    """The split of the module ``key``: a hash of the key alone, the same everywhere."""
    bucket = key_hash(key) % 100
    if bucket < TEST_PERCENT:
        return "test"
    return "val" if bucket < TEST_PERCENT + VAL_PERCENT else "train"


def normalize(text: str) -> str:
    """``\\r\\n`` to ``\\n``, tabs kept, every other control character dropped."""
    return _CONTROL.sub("", text.replace("\r\n", "\n"))


def corpus_documents(path: Path = CORPUS_PATH) -> list[Document]:
    """The shipped corpus, one document per ``# ---- name.py ----`` section."""
    text = path.read_text(encoding="utf-8")
    heads = list(_SECTION.finditer(text))
    return [Document(m.group(1), normalize(text[m.end(): nxt.start() if nxt else len(text)]), "corpus")
            for m, nxt in zip(heads, [*heads[1:], None], strict=True)]


def _python_files(root: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_PARTS.isdisjoint(rel.parts[:-1]) and not rel.name.startswith("test_"):
            yield rel.as_posix(), path


def _read(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        return normalize(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):  # unreadable, a broken link, or not UTF-8 on purpose
        return None


def directory_documents(root: Path, source: str, prefix: str = "", max_bytes: int | None = None) -> list[Document]:
    """Every readable ``.py`` file under ``root`` (see ``_SKIP_PARTS``), keyed ``prefix + relative
    path``; with ``max_bytes``, the files taken in key-hash order until that much text."""
    files = list(_python_files(root))
    if max_bytes is not None:
        files.sort(key=lambda item: key_hash(item[0]))
    docs: list[Document] = []
    total = 0
    for rel, path in files:
        text = _read(path)
        if not text or not text.strip():
            continue
        if max_bytes is not None and total + len(text) > max_bytes:
            break
        total += len(text)
        docs.append(Document(prefix + rel, text, source))
    return docs


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def site_roots() -> list[Path]:
    """Where this Python's third-party packages live, deduplicated."""
    paths = sysconfig.get_paths()
    candidates = [paths["purelib"], paths["platlib"], *site.getsitepackages()]
    return sorted({Path(p).resolve() for p in candidates if Path(p).is_dir()})


def gather(*, stdlib: bool = True, site_packages_mb: float = 0.0) -> list[Document]:
    """The corpus, plus the standard library's modules the corpus lacks, plus (``site_packages_mb``
    > 0) up to that many MB of site-packages modules. Sorted by key."""
    docs = {d.key: d for d in corpus_documents()}
    if stdlib:
        for d in directory_documents(stdlib_root(), "stdlib"):
            docs.setdefault(d.key, d)
    budget = int(site_packages_mb * 1e6)
    for root in site_roots() if budget > 0 else []:
        for d in directory_documents(root, "site", prefix="site/", max_bytes=budget):
            docs.setdefault(d.key, d)
            budget -= len(d.text)
    return [docs[k] for k in sorted(docs)]


def by_split(docs: Iterable[Document]) -> dict[Split, list[Document]]:
    out: dict[Split, list[Document]] = {"train": [], "val": [], "test": []}
    for d in docs:
        out[split_of(d.key)].append(d)
    return out


def encode_documents(tokenizer: Any, docs: list[Document], bos: int, eos: int) -> np.ndarray:
    """``bos doc eos`` for every document, concatenated, as uint16 token ids (``tokenizer`` is a
    ``tokenizers.Tokenizer`` with fewer than 65,536 ids)."""
    if tokenizer.get_vocab_size() > 65_536:
        raise ValueError("token ids do not fit uint16")
    parts = [np.array([bos, *enc.ids, eos], dtype=np.uint16)
             for enc in tokenizer.encode_batch([d.text for d in docs], add_special_tokens=False)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
