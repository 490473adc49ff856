"""Prompt tokenization on the web side, without mlx.

The web process tokenizes with the model's own tokenizer (transformers' fast tokenizer, no torch)
so the context-length check happens before a job is dispatched, and the engine receives token ids.
The tokenizer is loaded once per process and per model path.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError, TemplateSyntaxError

from api.common.errors import ChatTemplateMissing, InvalidRequest, ServiceUnavailable
from api.serving.catalog import configured_models
from engine_worker.runner.token_bytes import piece_bytes

logger = logging.getLogger(__name__)

_load_lock = threading.Lock()
# SentencePiece's byte-fallback pieces: one byte each, for characters outside the vocabulary.
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    context_length: int
    vocab_size: int  # the model's logits: token ids a logit_bias may name are below it


class PromptTokenizer:
    """Tokenizes plain prompts and chat messages for one model folder."""

    def __init__(self, model_path: str) -> None:
        from tokenizers.decoders import ByteLevel
        from transformers import AutoTokenizer  # heavy import, only when first needed

        self._tokenizer = AutoTokenizer.from_pretrained(model_path)
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        self._byte_level = backend is not None and isinstance(backend.decoder, ByteLevel)
        config = json.loads((Path(model_path) / "config.json").read_text())
        self.info = ModelInfo(path=model_path, name=Path(model_path).name, context_length=_context_length(config, model_path),
                              vocab_size=_vocab_size(config, len(self._tokenizer)))

    @property
    def has_chat_template(self) -> bool:
        """Whether chat messages can be rendered (base models often ship without a template)."""
        return bool(self._tokenizer.chat_template)

    def decode_tokens(self, token_ids: list[int]) -> str:
        """The text of some token ids (a log probability's ``token``: api/jobs/logprobs.py)."""
        text = self._tokenizer.decode(token_ids)
        return text if isinstance(text, str) else "".join(text)  # a list only for a batch of sequences

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (OpenAI's logprobs ``bytes``), which for a token that ends inside
        a character are not its text's: a byte-level BPE token's bytes from its vocabulary piece,
        a SentencePiece byte-fallback token's (``<0xE2>``) its byte, any other token its text's
        UTF-8 (SentencePiece's "▁" read as the space it stands for)."""
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):  # None for an id outside the vocabulary (one id: never a list)
            return b""
        if self._byte_level:
            return piece_bytes(piece)
        byte = _BYTE_FALLBACK.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte[1], 16)])
        return piece.replace("\u2581", " ").encode()

    def added_token_id(self, text: str) -> int | None:
        """The id of ``text`` where the tokenizer has it as one added token (a control token such
        as Mistral's ``[TOOL_CALLS]``), else None."""
        return self._tokenizer.get_added_vocab().get(text)

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a plain prompt, with the tokenizer's special tokens (BOS) once."""
        return list(self._tokenizer.encode(text))

    @property
    def chat_template(self) -> str:
        """The chat template's text ("" for none); a dict of named templates, joined."""
        template = self._tokenizer.chat_template or ""
        return "\n".join(template.values()) if isinstance(template, dict) else template

    def encode_messages(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of chat messages rendered with the model's chat template, ending with the
        assistant generation prompt. The template emits BOS itself, so no special tokens are added
        on top (that would double it)."""
        if not self.has_chat_template:
            raise ChatTemplateMissing(self.info.name)
        try:
            rendered: Any = self._tokenizer.apply_chat_template(
                messages, tools=tools,  # type: ignore[arg-type]  # transformers wants an invariant list[dict | Callable]
                tokenize=True, add_generation_prompt=True, return_dict=False
            )
        except TemplateSyntaxError as exc:  # the model folder's template is broken: not the request's fault
            logger.error("The chat template of %s does not compile: %s", self.info.path, exc)
            raise ServiceUnavailable(f"The chat template of the model {self.info.name} is broken.") from exc
        except TemplateError as exc:  # the template refuses this conversation (raise_exception, say)
            raise InvalidRequest(f"The model's chat template rejected these messages: {exc}", param="messages",
                                 code="invalid_messages") from exc
        if isinstance(rendered, dict) or hasattr(rendered, "input_ids"):
            rendered = rendered["input_ids"]
        return [int(token) for token in rendered]


def _context_length(config: dict[str, Any], model_path: str) -> int:
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"):
        value = config.get(key) or (config.get("text_config") or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"{model_path}/config.json has no context length (max_position_embeddings)")


def _vocab_size(config: dict[str, Any], tokenizer_size: int) -> int:
    value = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return value if isinstance(value, int) and value > 0 else tokenizer_size


@lru_cache(maxsize=32)  # one per configured model
def _load(model_path: str) -> PromptTokenizer:
    return PromptTokenizer(model_path)


def get_tokenizer(model_path: str | None = None) -> PromptTokenizer:
    """The cached tokenizer of ``model_path`` (default: the first configured model's folder).

    Raises ServiceUnavailable if the model folder cannot be read: that is an operator problem,
    answered with a 503 rather than blamed on the request."""
    path = model_path or configured_models()[0].path
    # lru_cache is thread-safe for lookups but may build twice under a race; the lock avoids
    # loading a large tokenizer twice when the first requests arrive together.
    with _load_lock:
        try:
            return _load(path)
        except (OSError, ValueError) as exc:
            logger.error("Cannot load the tokenizer from %s: %s", path, exc)
            raise ServiceUnavailable(f"The model at {path} is not available.") from exc


def load_tokenizer_at_start() -> bool:
    """Load every configured model's tokenizer now, while the web process starts (the ASGI module
    calls this).

    Without it the first submission of every web process would pay for importing transformers
    and reading the tokenizer (seconds), and every request that arrived meanwhile would queue
    behind it. Synchronous on purpose: loading it on a thread races with other imports of
    transformers (its lazy module can hand a half-initialised package to another importer). A
    failure is only logged: submissions answer 503 until the model folder is readable."""
    loaded = True
    for model in configured_models():
        try:
            get_tokenizer(model.path)
        except ServiceUnavailable:
            loaded = False  # get_tokenizer logged why
    return loaded
