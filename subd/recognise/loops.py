"""Repetition loops: in a hypothesis of a script without spaces, and of the forced prefix.

In Chinese every character is a word of the hypothesis (models.words), so a decode that runs
into a loop of one character ("不和和和和和和和和和…", espeak-ng Mandarin on Whisper's full
input) spreads its copies over the audio's last seconds, each one timed and "heard out". Two
such decodes agree character by character, and agreement committed the copies: the stream of
the 100-character espeak-ng text on the full input committed 28 looped copies of 和 and 千 (CER
0.76 against 0.62 on the cut input). The decoder's loop guard (models.decoding.tail_loop) stops
a loop only once it covers 20 tokens, and keeps the copies; the budget cut removes repeats of 4
tokens and more only. English loops repeat phrases and are left to those guards and to
readings.stacked_tail_cut, except a decode that copies its forced prefix (``restates_prefix``).

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
from subd.recognise.commit import norm_word
from subd.script import has_cjk
from subd.types import Word

MIN_REPEATS_ONE = 4  # copies of one unit in a row
MIN_REPEATS = 3  # copies of an n-gram of 2..MAX_PERIOD units in a row
MAX_PERIOD = 4
RESTATED_WORDS = 3  # new words that repeat the forced prefix's, in order: a loop of it
UNSURE_PREFIX = 0.6  # ... of a prefix whose words' mean probability is below this


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


def restates_prefix(words: Sequence[Word | WordTiming], prefix_text: str) -> bool:
    """Do the words decoded after a forced prefix start by saying ``RESTATED_WORDS`` of its
    words again, in order (case and marks aside)? A forced prefix Whisper misread is what it
    then continues by copying: a stream's start at D = 1 s committed "I'll let's do it." for
    "Unless to be", and every decode forced with it read "I'll let's do it." again over
    "rather cold-hearted and rather selfish"."""
    old = [w for w in map(norm_word, prefix_text.split()) if w]
    new = [w for w in (norm_word(w.text) for w in words[:RESTATED_WORDS]) if w]
    n = RESTATED_WORDS
    return len(new) == n and any(old[i:i + n] == new for i in range(len(old) - n + 1))


def transcribe_unlooped(engine: WhisperEngine, window, prompt: list[int] | None, policy,
                        prefix_words: Sequence[Word] = (), **kwargs) -> WindowResult:
    """``engine.transcribe_window``, and once more without the forced prefix when the decode
    ran into a loop of it:

    * a CJK loop (with the prompt or a prefix): the committed text before the window and inside
      it is what the loop grew from (espeak-ng Mandarin on the full input: the three looped
      decodes of a stream came out clean without it, CER 0.70 -> 0.67); redone without either,
      and the second decode is kept only when it does not loop;
    * the words after a forced prefix restate it (``restates_prefix``) and Whisper was unsure
      of the prefix's words (``prefix_words``, the committed words it spells: their mean
      probability under ``UNSURE_PREFIX``): redone with the prompt but without the prefix,
      every word of the window read afresh (the commit point then drops those in committed
      audio, as for any decode without a prefix). A phrase said again that Whisper read
      surely is left alone: redone without the prefix, three copies of "we will not go back"
      kept two under some update timings (tests/test_repeated_speech.py, seeds 223 and 307).

    The second decode costs an update, on such decodes only."""
    result = engine.transcribe_window(window, prompt, policy, **kwargs)
    prefix = kwargs.get("prefix")
    without = {**kwargs, "prefix": (), "retry_without_prefix": None}
    if (prompt or prefix) and loop_start(result.words) is not None:
        again = engine.transcribe_window(window, None, policy, **without)
        return result if loop_start(again.words) is not None else again
    if prefix_words and result.prefix_used and result.words and \
            sum(w.probability for w in prefix_words) < UNSURE_PREFIX * len(prefix_words) and \
            restates_prefix(result.words, " ".join(w.text for w in prefix_words)):
        return engine.transcribe_window(window, prompt, policy, **without)
    return result
