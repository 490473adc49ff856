"""A one-token answer's text: never empty when its token has text."""

from __future__ import annotations

from engine_worker.common.request import Request, SamplingParams
from engine_worker.sched.scheduler import Scheduler
from tests.engine_worker.engine_helpers import final, prompt_ids, run_scheduler


def test_one_token_answer_of_a_lone_space_keeps_its_text(tiny_model):
    """The leading-space trim (mlx-lm's convention) once made a one-space answer "": an empty
    completion where the model did answer."""
    model, tokenizer = tiny_model
    space = tokenizer.convert_tokens_to_ids("Ġ")  # byte-level BPE: a lone space
    sp = SamplingParams(max_tokens=1, temperature=0.0, logit_bias={space: 100.0})
    outs = run_scheduler(Scheduler(model, tokenizer), {0: [Request("one", prompt_ids(tokenizer, 12), sp)]})["one"]
    last = final(outs)
    assert last.output_token_ids == [space]
    assert "".join(o.new_text for o in outs) == " "
