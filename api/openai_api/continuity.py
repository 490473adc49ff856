"""A streamed completion across a restart of its job.

When an engine worker dies, its job runs again from the start on another worker, and the job's
stream says so with a ``reset``. The service's own clients drop their text and start again; an
OpenAI client cannot, since a chunk once sent is part of its answer. With greedy decoding or a
``seed`` the new attempt usually writes the same text again, so the stream can go on: the new
attempt's text is held back while it repeats what was sent, and what comes after is sent as
usual. Only if it writes something else does the stream end with an error (the job itself goes
on, and its row will have the new attempt's text).
"""

from __future__ import annotations


class Diverged(Exception):
    """The new attempt's text is not what was already sent."""


class StreamContinuity:
    def __init__(self) -> None:
        self._parts: list[str] = []  # what was sent (one part after a reset)
        self._attempt: str | None = None  # the new attempt's text while it repeats what was sent

    @property
    def sent(self) -> str:
        return "".join(self._parts)

    def reset(self) -> None:
        if self._parts:
            self._parts = [self.sent]
            self._attempt = ""

    def text(self, text: str) -> str:
        """What of ``text`` (the job's next chunk) to send. Raises Diverged."""
        if self._attempt is None:  # the per-chunk path: no copy of what was sent
            self._parts.append(text)
            return text
        sent = self._parts[0]
        self._attempt += text
        if len(self._attempt) <= len(sent):
            if not sent.startswith(self._attempt):
                raise Diverged
            return ""
        if not self._attempt.startswith(sent):
            raise Diverged
        new, self._parts, self._attempt = self._attempt[len(sent):], [self._attempt], None
        return new

    def end(self) -> None:
        """The job's final arrived. Raises Diverged if the new attempt ended short of what was sent."""
        if self._attempt is not None and self._attempt != self._parts[0]:
            raise Diverged
