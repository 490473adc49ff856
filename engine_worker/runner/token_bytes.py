"""The bytes of byte-level BPE tokens (GPT-2's scheme, used by Llama 3, Qwen and the tiny model).

Each vocabulary piece spells a fixed byte string in a printable alphabet of 256 characters; a
character of several UTF-8 bytes may be split over two or more tokens, each holding some of its
bytes. The detokenizer feeds these bytes to an incremental UTF-8 decoder; the web side reports
them as OpenAI's logprobs ``bytes``. Plain Python: importing this loads neither mlx nor a BLAS.
"""

from __future__ import annotations

from codecs import utf_8_decode
from functools import cache


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable-character map, character to byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def piece_bytes(piece: str) -> bytes:
    """The bytes a byte-level vocabulary piece stands for; characters outside the byte alphabet
    (special tokens) are taken as their own UTF-8, as mlx-lm does."""
    decoder = _byte_decoder()
    out = bytearray()
    for ch in piece:
        b = decoder.get(ch)
        if b is None:
            out.extend(ch.encode("utf-8"))
        else:
            out.append(b)
    return bytes(out)


def token_byte_table(tokenmap: list[str]) -> list[bytes]:
    """The bytes of every token of a byte-level vocabulary, by token id."""
    return [piece_bytes(piece) for piece in tokenmap]


def token_texts(table: list[bytes]) -> list[str | None]:
    """Each token's text when its bytes are whole UTF-8 characters (invalid bytes read as U+FFFD,
    as the decoder gives them); None when they end inside a character."""
    texts: list[str | None] = []
    for data in table:
        text, used = utf_8_decode(data, "replace", False)
        texts.append(text if used == len(data) else None)
    return texts
