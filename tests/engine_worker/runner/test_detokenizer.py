"""The fast byte-level detokenizer gives mlx-lm's text, and never a broken character."""

from __future__ import annotations

import codecs
import random

from engine_worker.runner.detokenizer import ByteLevelDetokenizer, MlxDetokenizer, detokenizer_factory

NIHON_E = [167, 250, 103, 167, 255, 110, 132, 107]  # "日本é", one token per UTF-8 byte


def test_fast_detokenizer_text_equals_mlx_lm_streaming_detokenizer(tiny_model):
    _, tokenizer = tiny_model
    make = detokenizer_factory(tokenizer)
    assert isinstance(make(), ByteLevelDetokenizer)
    tokenmap = tokenizer.detokenizer.tokenmap
    # mlx-lm maps the NUL byte's character to its UTF-8 instead of b"\0" (a bug); skip those tokens.
    usable = [i for i, piece in enumerate(tokenmap) if "\u0100" not in piece]
    rng = random.Random(7)
    for _ in range(200):
        tokens = [rng.choice(usable) for _ in range(rng.randrange(1, 30))]
        fast = make()
        text = "".join(fast.add(t) for t in tokens) + fast.finish()
        reference = tokenizer.detokenizer
        for t in tokens:
            reference.add_token(t)
        reference.finalize()
        assert text == reference.text, tokens


def test_leading_space_is_trimmed_unless_it_is_the_whole_text(tiny_model):
    _, tokenizer = tiny_model
    make = detokenizer_factory(tokenizer)
    space, x = tokenizer.convert_tokens_to_ids(["Ġ", "x"])

    def text(tokens):
        detok = make()
        return "".join(detok.add(t) for t in tokens) + detok.finish()

    assert text([space]) == " "  # mlx-lm's detokenizer gives "": an empty answer
    assert text([space, x]) == "x"
    assert text([space, space, x]) == " x"
    assert text([x, space]) == "x "


def test_split_multibyte_characters_are_held_until_complete(tiny_model):
    _, tokenizer = tiny_model
    detok = detokenizer_factory(tokenizer)()
    pieces = [detok.add(t) for t in NIHON_E]
    assert pieces == ["", "", "日", "", "", "本", "", "é"]


def test_other_tokenizers_fall_back_to_mlx_lm_detokenizers(tiny_model):
    _, tokenizer = tiny_model

    class Wrapped:
        @property
        def detokenizer(self):
            return tokenizer.detokenizer

    assert isinstance(detokenizer_factory(Wrapped())(), ByteLevelDetokenizer)

    class Custom:
        class _D:
            text = ""

            def add_token(self, t):
                self.text += str(t)

            def finalize(self):
                pass

            @property
            def last_segment(self):
                return self.text[-1:]

        @property
        def detokenizer(self):
            return self._D()

    detok = detokenizer_factory(Custom())()
    assert isinstance(detok, MlxDetokenizer) and detok.add(5) == "5"


def _incremental_reference(table: list[bytes], tokens: list[int]) -> list[str]:
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    return [decode(table[t]) for t in tokens] + [decode(b"", True)]


def test_pieces_equal_the_incremental_utf8_decoder_for_any_bytes_valid_or_not():
    # Whole characters, lone lead and continuation bytes, invalid bytes, and multi-byte
    # characters split at every point, in random order.
    rng = random.Random(3)
    chars = ["a", "é", "日", "😀", "\u0100"]
    table = [b" a"] + [b"x" + c.encode() for c in chars] + [b"\xff", b"\x80", b"\xc3", b"\xe6\x97", b"\xf0\x9f\x98"]
    for c in chars:
        data = c.encode()
        table += [data[:i] for i in range(1, len(data))] + [data[i:] for i in range(1, len(data))]
    for _ in range(500):
        tokens = [rng.randrange(len(table)) for _ in range(rng.randrange(1, 12))]
        detok = ByteLevelDetokenizer(table)
        pieces = [detok.add(t) for t in tokens] + [detok.finish()]
        reference = _incremental_reference(table, tokens)
        first = next((i for i, piece in enumerate(reference) if piece), None)
        if first is not None and reference[first].startswith(" "):
            reference[first] = reference[first][1:]
        assert pieces == reference, tokens
