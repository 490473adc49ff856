"""The model as the generator sees it: its logits in float32.

mlx-lm's ``BatchGenerator`` normalizes each step's logits into log probabilities
(``logits - logsumexp(logits)``) in the logits' own dtype, and every sampler, greedy included,
reads those. In bfloat16 a log probability near -10 is stored in steps of 0.0625, so tokens whose
logits differ by less than that come out equal and greedy decoding takes the lowest id among them
instead of the model's top token. With a flat distribution (the random-weight demo models: all
32,000 logits of m300 lie within about 0.1) about 2,000 ids tie, and the lowest, often a special
token such as ``<|eos|>``, wins. Normalizing in float32, as vLLM does (vllm-project/vllm#19),
keeps greedy decoding the argmax of the model's logits and the reported log probabilities exact to
the logits. mlx-lm offers no option for it; wrapping the model uses only its public interface.

The prefill steps discard the model's output (they keep only the caches), so the cast is never
evaluated for them: it costs one (batch, vocabulary) cast per decode step.
"""

from __future__ import annotations

from typing import Any

from engine_worker.runner.mlx_core import mx


class Float32Logits:
    """Wraps a model so that calling it returns float32 logits; every other attribute (``layers``,
    ``make_cache``, ``args``) is the model's own."""

    __slots__ = ("model",)

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        logits = self.model(*args, **kwargs)
        return logits if logits.dtype == mx.float32 else logits.astype(mx.float32)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)
