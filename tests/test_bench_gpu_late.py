"""subd bench gpu says why each late word was late (what the planner or Whisper did)."""

from __future__ import annotations

from subd.bench.gpu_report import late_cause
from subd.types import Word

MS = 1_000_000


def _w(text: str, end_ms: int) -> Word:
    return Word(text, (end_ms - 200) * MS, end_ms * MS)


def test_a_late_word_is_put_down_to_its_cause():
    late = _w("married", 5000)
    tail = (_w("he", 4700), _w("married", 5060))  # the last result's tentative words
    # it was there, past that update's deadline: left to the next result, which came too late
    assert late_cause(late, 8.0, tail, 4800 * MS) == "deferred"
    # it was there and due, yet not committed (not heard out)
    assert late_cause(late, 8.0, tail, 5100 * MS) == "due"
    # Whisper had left it out, or spelt it otherwise
    assert late_cause(late, 8.0, (_w("he", 4700), _w("marry", 5060)), 5100 * MS) == "unseen"
    assert late_cause(late, 8.0, (), None) == "first_update"
    assert late_cause(late, 2.0, tail, 4800 * MS) == "first_3s"
