"""A finished job's log probabilities as the API shows them: stored as token ids and numbers
(``Job.logprobs``), rendered with the model's tokenizer when read.

Each token's text is decoded after the token before it (see ``_token_text``). With a byte-level
tokenizer a character split over two tokens shows as U+FFFD in each; ``bytes`` (OpenAI's field)
holds each token's own bytes, so a client joining them gets the character back.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from api.serving.catalog import model_path
from api.serving.tokenization import get_tokenizer


@lru_cache(maxsize=65536)
def _token_text(model_path: str, previous: int | None, token_id: int) -> str:
    """A token's text where it stands, after ``previous``: decoded with it and less its own text,
    as the streaming detokenizer does, so that tokenizers which mark a word's space on the token
    (SentencePiece's "▁") keep it; byte-level ones give the same text either way."""
    tokenizer = get_tokenizer(model_path)
    if previous is None:
        return tokenizer.decode_tokens([token_id])
    return tokenizer.decode_tokens([previous, token_id])[len(tokenizer.decode_tokens([previous])):]


def job_logprobs(stored: list[Any] | None, *, model: str | None = None) -> list[dict[str, Any]] | None:
    """``GET /jobs/<id>``'s ``logprobs``: per completion token its text, id, log probability and
    the most likely alternatives, best first (each alternative's text as it would have stood in
    that place). None when the job did not ask (or has not ended). ``stored`` entries follow one
    another in the completion; a streamed chunk's first entry is taken without its predecessor.
    ``model``: the job's (default: the first configured model)."""
    if stored is None:
        return None
    path = get_tokenizer(model_path(model)).info.path
    out, previous = [], None
    for token, logprob, top in stored:
        out.append({"token": _token_text(path, previous, token), "token_id": token, "logprob": logprob,
                    "top_logprobs": [{"token": _token_text(path, previous, t), "token_id": t, "logprob": lp}
                                     for t, lp in top]})
        previous = token
    return out


def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of a chat choice (or chunk) from :func:`job_logprobs`'s entries."""
    tokenizer = get_tokenizer()

    def entry(e: dict[str, Any]) -> dict[str, Any]:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": list(tokenizer.token_bytes(e["token_id"]))}

    return {"content": [{**entry(e), "top_logprobs": [entry(t) for t in e["top_logprobs"]]} for e in entries],
            "refusal": None}


def text_logprobs(entries: list[dict[str, Any]], *, text: str, offset: int = 0) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of a (legacy) text completion's choice (or chunk) from
    :func:`job_logprobs`'s entries. ``text``: what these tokens became (the completion's text drops
    the first token's leading space, which the token keeps); ``offset``: where ``text`` starts in
    the whole completion. ``top_logprobs`` always holds the chosen token, as OpenAI's does."""
    joined = "".join(e["token"] for e in entries)
    trimmed = len(joined) - len(text) if len(joined) > len(text) and joined.endswith(text) else 0
    offsets, at = [], offset - trimmed
    for e in entries:
        offsets.append(max(at, offset))
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{e["token"]: e["logprob"], **{t["token"]: t["logprob"] for t in e["top_logprobs"]}}
                             for e in entries],
            "text_offset": offsets}
