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


def chat_logprobs(stored: list[Any]) -> dict[str, Any]:
    """OpenAI's ``choices[0].logprobs`` of a chat completion."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = _text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(token, logprob), "top_logprobs": [entry(t, lp) for t, lp in top]}
                        for token, logprob, top in stored]}


def text_logprobs(stored: list[Any], *, offset: int = 0) -> dict[str, Any]:
    """OpenAI's ``choices[0].logprobs`` of a (legacy) text completion; ``offset``: where the
    completion's text starts in the choice's ``text``."""
    tokens = [_text(token) for token, _, _ in stored]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": [logprob for _, logprob, _ in stored],
            "top_logprobs": [{_text(t): lp for t, lp in top} for _, _, top in stored],
            "text_offset": offsets}
