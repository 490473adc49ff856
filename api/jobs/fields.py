"""A text column that stores any Python string exactly, on every supported database.

PostgreSQL's ``text`` refuses NUL (U+0000), and a model may generate it (a byte-level tokenizer
has a token for byte 0). :class:`LosslessTextField` keeps such text in an ordinary text column
with a reversible escape: U+FFFF (a Unicode noncharacter, which no ordinary text uses) is the
escape character; NUL is stored as U+FFFF ``0`` and U+FFFF itself as U+FFFF U+FFFF. Text with
neither character, all text before migration 0008, is stored unchanged, so the column still
reads as the text in ``psql`` and the migration had only the rare rows holding U+FFFF to rewrite.

Every ORM read and write, ``values()`` and hand-written SQL that prepares its parameters with the
field (``get_db_prep_value``) and builds instances with its converters (``Manager.raw``, as the
claim does) see the real text. SQL that compares the column to a constant in the database sees the stored form:
``exact`` lookups match (the constant is escaped too); ``contains`` may also match a NUL at an
escaped U+FFFF, and no code filters on the text.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import models

ESCAPE = "\uffff"
NUL = "\x00"
_ESCAPED = re.compile(f"{ESCAPE}([{ESCAPE}0])")


def encode_text(text: str) -> str:
    """The stored form of ``text`` (no NUL in it; ``decode_text`` gives ``text`` back)."""
    if NUL not in text and ESCAPE not in text:
        return text
    return text.replace(ESCAPE, ESCAPE + ESCAPE).replace(NUL, ESCAPE + "0")


def decode_text(stored: str) -> str:
    """The text whose stored form is ``stored``."""
    if ESCAPE not in stored:
        return stored
    return _ESCAPED.sub(lambda m: NUL if m.group(1) == "0" else ESCAPE, stored)


class LosslessTextField(models.TextField):
    """A ``TextField`` whose values may hold any character, NUL included (see the module)."""

    description = "Text (any characters, NUL included)"

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        return encode_text(value) if isinstance(value, str) else value

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return decode_text(value) if isinstance(value, str) else value
