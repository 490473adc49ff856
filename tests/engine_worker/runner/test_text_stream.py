"""Stop-string holdback on top of a streaming detokenizer."""

from __future__ import annotations

from engine_worker.runner.text_stream import TextStream


class PieceDetok:
    """Each token id indexes a text piece."""

    def __init__(self, pieces):
        self.pieces = pieces

    def add(self, t):
        return self.pieces[t]

    def finish(self):
        return ""


def _feed(pieces, stops):
    stream = TextStream(PieceDetok(pieces), stops)
    released = []
    for t in range(len(pieces)):
        released.append(stream.add(t))
        if stream.stopped:
            break
    else:
        released.append(stream.finish())
    return released, stream.stopped


def test_text_without_stop_strings_is_released_as_it_comes():
    assert _feed(["ab", "cd", "e"], []) == (["ab", "cd", "e", ""], False)


def test_stop_string_spanning_tokens_is_cut_and_never_released():
    released, stopped = _feed(["hello wo", "rl", "d and more"], ["world"])
    assert stopped and "".join(released) == "hello "
    assert all("wor" not in r for r in released)


def test_partial_match_is_held_back_then_released_when_it_does_not_complete():
    released, stopped = _feed(["say wo", "w!"], ["world"])
    assert not stopped and "".join(released) == "say wow!"
    assert released[0] == "say "  # "wo" might have started "world"


def test_earliest_of_several_stop_strings_wins():
    released, stopped = _feed(["a STOP b END"], ["END", "STOP"])
    assert stopped and "".join(released) == "a "
