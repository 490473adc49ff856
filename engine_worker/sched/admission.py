"""Checking and tokenizing a request before it may wait for admission."""

from __future__ import annotations

from typing import Any

from engine_worker.common.errors import InvalidRequest, PromptTooLong, TokenizationError, UnsupportedInput
from engine_worker.common.request import Request
from engine_worker.runner.logprobs import MAX_TOP_LOGPROBS


class RequestValidator:
    """Turns a request's prompt into token ids and refuses what cannot run.

    Every refusal is a :class:`~engine_worker.common.errors.RequestError` naming the request; the
    scheduler finishes that request alone with ``finish_reason="error"``.
    """

    def __init__(self, tokenizer: Any, max_model_len: int | None, vocab_size: int | None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def prepare(self, request: Request) -> None:
        """Set ``prompt_token_ids`` and ``num_prompt_tokens``, or raise a ``RequestError``."""
        rid = request.request_id
        multimodal = request.multimodal_input()
        if multimodal is not None:
            raise UnsupportedInput(multimodal, request_id=rid)
        sp = request.sampling_params
        if sp.max_tokens <= 0:
            raise InvalidRequest(f"max_tokens must be > 0, got {sp.max_tokens}", request_id=rid)
        if sp.temperature < 0:
            raise InvalidRequest("temperature must be >= 0", request_id=rid)
        if sp.logprobs is not None and not 0 <= sp.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {sp.logprobs}", request_id=rid)
        if request.prompt_token_ids is None:
            request.prompt_token_ids = self._tokenize(request)
        tokens = request.prompt_token_ids
        request.num_prompt_tokens = len(tokens)
        if not tokens:
            raise InvalidRequest("the prompt is empty", request_id=rid)
        if self.max_model_len is not None and len(tokens) > self.max_model_len:
            raise PromptTooLong(limit=self.max_model_len, length=len(tokens), request_id=rid)
        vocab = self.vocab_size
        if vocab is not None and not all(0 <= t < vocab for t in tokens):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", request_id=rid)

    def _tokenize(self, request: Request) -> list[int]:
        prompt = request.prompt
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        # A multimodal processor keeps its text tokenizer in ``.tokenizer`` (seed S23).
        encode = getattr(self.tokenizer, "encode", None) or self.tokenizer.tokenizer.encode
        try:
            return list(encode(prompt))
        # A tokenizer is third-party code: whatever it raises concerns this one prompt only.
        except Exception as exc:
            raise TokenizationError(f"tokenizer failed: {exc}", request_id=request.request_id) from exc
