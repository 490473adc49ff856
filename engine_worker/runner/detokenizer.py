"""Fast incremental detokenization for byte-level BPE tokenizers.

mlx-lm's ``BPEStreamingDetokenizer`` re-decodes its whole pending buffer in Python on every
token: with a small model and a full batch, a visible share of each decode step. For byte-level
vocabularies each token is a fixed byte string, so we precompute those bytes once per tokenizer
and feed them to the C incremental UTF-8 decoder: an incomplete multi-byte character stays inside
the decoder until its last byte arrives, so no broken character is ever released. Most tokens are
whole characters: their text is precomputed too, and taken as is while no partial character is
pending (one list lookup a token instead of a decoder call). Output matches mlx-lm's
detokenizer, including trimming one leading space of the text, except where that space is the
whole text: a one-space answer stays " " (mlx-lm's gives "", an empty completion). Other tokenizers keep mlx-lm's
streaming detokenizer (:class:`MlxDetokenizer`).
"""

from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Callable
from typing import Any

import engine_worker.runner.mlx_core  # noqa: F401  (OpenBLAS before mlx-lm loads mlx)

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

from engine_worker.runner.token_bytes import token_byte_table, token_texts

# ``_trim`` once the first text was a lone space, dropped: the text if nothing follows.
_HELD_SPACE = 2


class ByteLevelDetokenizer:
    """One request's text: ``add(token) -> new text``, ``finish() -> remaining text``.

    The same text as ``codecs.getincrementaldecoder("utf-8")("replace")`` fed each token's bytes
    (whose ``decode`` is a Python wrapper around ``utf_8_decode``, called here directly).
    """

    __slots__ = ("_table", "_texts", "_pending", "_trim")

    def __init__(self, table: list[bytes], texts: list[str | None] | None = None) -> None:
        self._table = table
        self._texts = token_texts(table) if texts is None else texts
        self._pending = b""  # the bytes of a character not yet complete
        self._trim: bool | int = True  # the first text's leading space is dropped (mlx-lm's convention)

    def add(self, token: int) -> str:
        texts = self._texts
        text = texts[token] if token < len(texts) else "!"
        if text is None or self._pending:
            data = self._pending + (self._table[token] if token < len(texts) else b"!")
            text, used = utf_8_decode(data, "replace", False)
            self._pending = data[used:]
        if self._trim and text:
            return self._trimmed(text)
        return text

    def finish(self) -> str:
        text, _ = utf_8_decode(self._pending, "replace", True)
        self._pending = b""
        if self._trim and text:
            text = self._trimmed(text)
        if self._trim == _HELD_SPACE:  # nothing followed the first space: it is the answer
            self._trim = False
            return " "
        return text

    def _trimmed(self, text: str) -> str:
        """The first text, less one leading space (held while the space is all there is)."""
        if self._trim == _HELD_SPACE:  # the held space was the one trimmed
            self._trim = False
            return text
        if text == " ":
            self._trim = _HELD_SPACE
            return ""
        self._trim = False
        return text[1:] if text[0] == " " else text


class MlxDetokenizer:
    """Adapter giving any mlx-lm streaming detokenizer the ``add``/``finish`` interface."""

    __slots__ = ("_detok",)

    def __init__(self, detok: Any) -> None:
        self._detok = detok

    def add(self, token: int) -> str:
        self._detok.add_token(token)
        return self._detok.last_segment

    def finish(self) -> str:
        self._detok.finalize()
        return self._detok.last_segment


def detokenizer_factory(tokenizer: Any) -> Callable[[], ByteLevelDetokenizer | MlxDetokenizer]:
    """A function making one fresh detokenizer per request for ``tokenizer``."""
    detok = getattr(tokenizer, "detokenizer", None)
    if isinstance(detok, BPEStreamingDetokenizer):
        table = token_byte_table(detok.tokenmap)
        texts = token_texts(table)
        return lambda: ByteLevelDetokenizer(table, texts)
    return lambda: MlxDetokenizer(tokenizer.detokenizer)
