"""JobSpec (wire form) → engine Request."""

from __future__ import annotations

from engine_worker.common.request import Constraint, Request, SamplingParams
from engine_worker.protocol import JobSpec


def spec_to_request(spec: JobSpec) -> Request:
    """The engine request for ``spec``; the request id is the job id, the prompt is token ids
    (tokenized on the web side, so the context check happened before dispatch)."""
    params = SamplingParams(
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        top_p=spec.top_p,
        top_k=spec.top_k,
        min_p=spec.min_p,
        repetition_penalty=spec.repetition_penalty,
        presence_penalty=spec.presence_penalty,
        frequency_penalty=spec.frequency_penalty,
        logit_bias={int(token): float(bias) for token, bias in spec.logit_bias} or None,
        logprobs=spec.logprobs,
        stop=list(spec.stop),
        seed=spec.seed,
        ignore_eos=spec.ignore_eos,
        constraint=Constraint(spec.constraint_kind, spec.constraint) if spec.constraint_kind else None,
    )
    return Request(spec.job_id, list(spec.prompt_token_ids), params, priority=spec.priority)
