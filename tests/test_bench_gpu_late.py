"""subd bench gpu says why each late word was late (what the planner or Whisper did), and when
its degraded updates came back."""

from __future__ import annotations

from subd.bench.gpu_policy import Trial, degraded_moments
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


def test_degraded_updates_are_placed_in_the_trial():
    t = Trial("batched", 1024, 2000, first_send_ns=10_000 * MS)
    assert degraded_moments(t) == ""
    t.degraded_at_ns = [13_210 * MS] * 8 + [17_940 * MS] * 3 + [13_180 * MS]
    # one stall of 9 at 3.2 s, and 3 at 7.9 s: not spread over the trial
    assert degraded_moments(t) == " at [3.2 s x9, 7.9 s x3]"
