"""Repetition loops in a hypothesis of a script without spaces.

In Chinese every character is a word of the hypothesis (models.words), so a decode that runs
into a loop of one character ("不和和和和和和和和和…", espeak-ng Mandarin on Whisper's full
input) spreads its copies over the audio's last seconds, each one timed and "heard out". Two
such decodes agree character by character, and agreement committed the copies: the stream of
the 100-character espeak-ng text on the full input committed 28 looped copies of 和 and 千 (CER
0.76 against 0.62 on the cut input). The decoder's loop guard (models.decoding.tail_loop) stops
a loop only once it covers 20 tokens, and keeps the copies; the budget cut removes repeats of 4
tokens and more only. English loops repeat phrases and are left to those guards and to
commit.stacked_tail_cut.

A run of one CJK unit ``MIN_REPEATS_ONE`` times or more in a row, or of a CJK n-gram of up to
``MAX_PERIOD`` units ``MIN_REPEATS`` times or more, is a loop: the first copy stays (it may be
the real word, "不和"), the run's other copies and everything after them go (what follows a loop
was decoded from it). Chinese doubles a character ("谢谢", "看看") or a pair ("研究研究"), and
laughter may run longer ("哈哈哈"); four copies of a character or three of a pair in a row is a
loop in read or spoken text.
"""

from __future__ import annotations

from collections.abc import Sequence

from subd.models.alignment import WordTiming
from subd.models.engine import WhisperEngine, WindowResult
from subd.script import has_cjk
from subd.types import Word

MIN_REPEATS_ONE = 4  # copies of one unit in a row
MIN_REPEATS = 3  # copies of an n-gram of 2..MAX_PERIOD units in a row
MAX_PERIOD = 4


def _key(text: str) -> str:
    # the same unit with or without a trailing mark ("和", "和，") is one copy
    return text.strip().rstrip("，。？！、,.?!")


def loop_start(words: Sequence[Word | WordTiming]) -> tuple[int, int] | None:
    """(start, period) of the first CJK loop in ``words``, or None."""
    keys = [_key(w.text) for w in words]
    n = len(keys)
    for i in range(n):
        for period in range(1, MAX_PERIOD + 1):
            need = MIN_REPEATS_ONE if period == 1 else MIN_REPEATS
            if i + need * period > n:
                break
            gram = keys[i:i + period]
            if not all(has_cjk(k) for k in gram):
                continue
            if all(keys[i + r * period:i + (r + 1) * period] == gram for r in range(1, need)):
                return i, period
    return None


def cut_loop(words: list[Word]) -> list[Word]:
    """``words`` up to the first CJK loop's first copy (all of them when there is none)."""
    found = loop_start(words)
    if found is None:
        return words
    start, period = found
    return words[:start + period]


def transcribe_unlooped(engine: WhisperEngine, window, prompt: list[int] | None, policy,
                        **kwargs) -> WindowResult:
    """``engine.transcribe_window``, and once more without the prompt and the forced prefix
    when a decode that had either ran into a CJK loop: the committed text before the window
    and inside it is what the loop grew from (espeak-ng Mandarin on the full input: the three
    looped decodes of a stream came out clean without it, CER 0.70 -> 0.67). The second
    decode is kept only when it does not loop; it costs an update, on looped decodes only."""
    result = engine.transcribe_window(window, prompt, policy, **kwargs)
    if not (prompt or kwargs.get("prefix")) or loop_start(result.words) is None:
        return result
    kwargs = {**kwargs, "prefix": (), "retry_without_prefix": None}
    again = engine.transcribe_window(window, None, policy, **kwargs)
    return result if loop_start(again.words) is not None else again
