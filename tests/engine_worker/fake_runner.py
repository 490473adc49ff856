"""A scripted stand-in for the generator runner: scheduler tests without a model.

It keeps :class:`BatchRunner`'s defaults for what it lacks: no urgent lane (``insert_urgent``
inserts into its batch), no KV caches to extract, no KV bytes to measure."""

from __future__ import annotations

from dataclasses import dataclass

from engine_worker.common.config import SchedulerConfig
from engine_worker.runner.generator import BatchRunner, StepResult
from engine_worker.sched.scheduler import Scheduler


@dataclass
class Resp:
    uid: int
    token: int
    finish_reason: str | None = None
    prompt_cache: object = None
    all_tokens: object = None


class ScriptedRunner(BatchRunner):
    """Emits token 100+n for the n-th token of every sequence; 'length' at max_tokens.

    Paced like mlx-lm's generator: a sequence's prompt ends in the first step after its insert
    (``prompts_done``), and its tokens come out from the step after that.
    """

    instances: list[ScriptedRunner] = []

    def __init__(self, model, config):
        self.seqs: dict[int, list[int]] = {}  # uid -> [emitted, max_tokens]
        self.prompting: list[int] = []  # inserted, prompt not ended yet
        self.next_uid = 0
        self.fail_next: BaseException | None = None  # raised by the next step
        self.closed = False
        self.removals: list[list[int]] = []  # the uids of each remove() call
        ScriptedRunner.instances.append(self)

    def insert(self, tokens, *, max_tokens, cache, all_tokens, sampler, logits_processors, stop_sequences):
        uid = self.next_uid
        self.next_uid += 1
        self.seqs[uid] = [0, max_tokens]
        self.prompting.append(uid)
        return uid

    def step(self):
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        out = []
        for uid, state in list(self.seqs.items()):
            if uid in self.prompting:
                continue
            state[0] += 1
            done = state[0] >= state[1]
            out.append(Resp(uid, self.token(state[0]), "length" if done else None))
            if done:
                del self.seqs[uid]
        done_prompts, self.prompting = self.prompting, []
        return StepResult(out, done_prompts)

    def token(self, n: int) -> int:
        """The n-th token (1-based) of every sequence."""
        return 100 + n

    def remove(self, uids, return_caches=False):
        self.removals.append(list(uids))
        for uid in uids:
            self.seqs.pop(uid, None)
            if uid in self.prompting:
                self.prompting.remove(uid)
        return {}

    def close(self):
        self.closed = True


class Tok:
    """A tokenizer for the scripted runner: characters encode to small ids, token t reads "<t>"."""

    eos_token_ids = {2}

    class _Detok:
        def __init__(self):
            self.text, self._off = "", 0

        def add_token(self, t):
            self.text += f"<{t}>"

        def finalize(self):
            pass

        @property
        def last_segment(self):
            seg, self._off = self.text[self._off:], len(self.text)
            return seg

    @property
    def detokenizer(self):
        return self._Detok()

    def encode(self, text):
        return [ord(c) % 50 for c in text]


def scripted_scheduler(max_model_len: int = 100, **config) -> Scheduler:
    """A scheduler over a :class:`ScriptedRunner`, with no model behind it (its memory is not
    budgeted: the model's sizes are unknown)."""
    ScriptedRunner.instances.clear()
    return Scheduler(object(), Tok(), SchedulerConfig(**config), runner_factory=ScriptedRunner,
                     max_model_len=max_model_len)
