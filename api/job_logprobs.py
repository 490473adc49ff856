"""A finished job's log probabilities as the API shows them: stored as token ids and numbers
(``Job.logprobs``), rendered with the model's tokenizer when read.

Each token's text is its own decoding. With a byte-level tokenizer a character split over two
tokens shows as U+FFFD in each; ``bytes`` (OpenAI's field) then holds that text's UTF-8, not the
token's raw bytes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from api.tokenization import get_tokenizer


@lru_cache(maxsize=65536)
def _token_text(model_path: str, token_id: int) -> str:
    return get_tokenizer(model_path).decode_token(token_id)


def _text(token_id: int) -> str:
    return _token_text(get_tokenizer().info.path, int(token_id))


def job_logprobs(stored: list[Any] | None) -> list[dict[str, Any]] | None:
    """``GET /jobs/<id>``'s ``logprobs``: per completion token its text, id, log probability and
    the most likely alternatives, best first. None when the job did not ask (or has not ended)."""
    if stored is None:
        return None
    return [{"token": _text(token), "token_id": token, "logprob": logprob,
             "top_logprobs": [{"token": _text(t), "token_id": t, "logprob": lp} for t, lp in top]}
            for token, logprob, top in stored]


def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of a chat choice (or chunk) from :func:`job_logprobs`'s entries."""
    def entry(e: dict[str, Any]) -> dict[str, Any]:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode())}

    return {"content": [{**entry(e), "top_logprobs": [entry(t) for t in e["top_logprobs"]]} for e in entries]}


def text_logprobs(entries: list[dict[str, Any]], *, offset: int = 0) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of a (legacy) text completion's choice (or chunk) from
    :func:`job_logprobs`'s entries; ``offset``: where their text starts in the whole completion."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}
