"""The commit policy of the streaming recogniser: which words of a new hypothesis become final.

Two modes, by what the caller knows:

* **Deadline mode** (``commit_until_ns`` given: the pipeline, which knows the tick clock). A
  word is committed when its deadline leaves no later update: the pipeline asks for every word
  ending by ``commit_until_ns`` (its tick's look-ahead fetch comes before the next update's
  result can be in), and those words are taken from this hypothesis, the one with the most right
  context they will ever get. Nothing is decided before it has to be, with one exception that
  costs no quality: two decodes that agree on a word heard out for ``agree_context_ms`` commit it
  early (Whisper does not change such a word any more; it keeps the decoded tail short when D is
  long). A pause after the last word commits nothing: the speaker may go on ("ask not. What").
  A decode that stopped short of the last one's words keeps those as its tail (``unread_from``).
* **Agreement mode** (no deadline: benchmarks and tools that drive the recogniser alone), as
  before: LocalAgreement-2 over decodes that heard the word out, bounded by ``max_tentative_ms``
  (where the last decode changed words two decodes agreed on, their reading commits: voted).

In both modes the window can never overflow (``max_window_ms``: all but the last word commit).
What a decode's words are before any of this (the committed audio re-stated, loops, copies
stacked at the window's end): subd.recognise.readings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from subd.types import Word

NS_PER_MS = 1_000_000
VOTE_SLACK_MS = 100  # word times move by ±100 ms between decodes (DTW): voted, readings


class PolicyConfig(Protocol):
    agree_guard_ms: int
    agree_min_probability: float
    unsure_agree_decodes: int
    agree_context_ms: int
    confident_guard_ms: int
    confident_min_probability: float
    max_tentative_ms: int
    max_window_ms: int


def norm_word(text: str) -> str:
    return re.sub(r"[^\w']+", "", text.lower())


@dataclass(frozen=True, slots=True)
class CommitDecision:
    n_commit: int  # the first n words of the hypothesis are decided now
    streak: tuple[int, ...]  # per word: decodes in a row that heard it out, same words up to it
    forced_cut: bool  # the window reached max_window_ms
    words: tuple[Word, ...]  # what commits: those n words, or the reading voted for (voted)


def decode_streak(words: Sequence[Word], previous: Sequence[Word],
                  previous_streak: Sequence[int], n_heard: int) -> list[int]:
    """streak[i]: decodes in a row, this one included, that heard words[i] out (the first
    ``n_heard`` words) with the same words up to it; 0 for words not heard out."""
    streak = [0] * len(words)
    for i in range(n_heard):
        if i >= len(previous) or norm_word(previous[i].text) != norm_word(words[i].text):
            streak[i:n_heard] = [1] * (n_heard - i)  # the words up to here differ
            break
        streak[i] = previous_streak[i] + 1
    return streak


def decide(cfg: PolicyConfig, words: Sequence[Word], previous: Sequence[Word],
           previous_streak: Sequence[int], end_ns: int, window_ms: int,
           commit_until_ns: int | None, started: bool = True) -> CommitDecision:
    """How many leading words of ``words`` (after the commit point) commit now. ``started``:
    the stream has committed words (deadline mode: its first words wait for their deadline)."""
    # a word that ends right at the audio end may be cut short (the speaker is mid-word):
    # two decodes of nearly the same audio agree on such a guess, so it does not count
    guard_ns = cfg.agree_guard_ms * NS_PER_MS
    heard = 0
    while heard < len(words) and end_ns - words[heard].end_ns >= guard_ns:
        heard += 1
    streak = decode_streak(words, previous, previous_streak, heard)
    # Agreement needs 2 (both decodes heard the word out) and Whisper's probability, or
    # unsure_agree_decodes in a row: two unsure guesses that agree are still guesses.
    agreed = 0
    while agreed < heard and streak[agreed] >= 2 and (
            min(previous[agreed].probability, words[agreed].probability)
            >= cfg.agree_min_probability or streak[agreed] >= cfg.unsure_agree_decodes):
        agreed += 1
    if commit_until_ns is not None:
        # A stream's first words have no words before them, and Whisper reads them from the
        # audio after them alone: with 2 s of it two decodes agreed on "I'd like to" ("Unless
        # to") and "How he" ("Had he"), read right from 3 s on; they wait for their deadline.
        context_ns = cfg.agree_context_ms * NS_PER_MS
        early = 0
        while started and early < agreed and end_ns - words[early].end_ns >= context_ns:
            early += 1
        # a due word the decode has not heard out (it may be cut short at the audio end)
        # waits for the next update: late by part of an update, where committing the guess
        # puts a cut word into every later decode's prefix ("old sp Sp Sp Sp")
        due = 0
        while due < heard and words[due].end_ns <= commit_until_ns:
            due += 1
        n = max(early, due)
    else:
        n = agreed
        sure_ns = cfg.confident_guard_ms * NS_PER_MS
        while (cfg.confident_min_probability < 1.0 and n + 1 < len(words)
               and end_ns - words[n].end_ns >= sure_ns
               and words[n].probability >= cfg.confident_min_probability):
            n += 1
        while n < len(words) and end_ns - words[n].end_ns >= cfg.max_tentative_ms * NS_PER_MS:
            n += 1
    forced = window_ms >= cfg.max_window_ms and n < len(words) - 1
    if forced:
        n = len(words) - 1  # never let the window overflow: commit all but the last word
    if commit_until_ns is None and n > agreed:
        commit, n = voted(words, n, previous, previous_streak, streak)
        return CommitDecision(n, tuple(streak), forced, tuple(commit))
    if commit_until_ns is not None and n:
        commit = outvoted_at_deadline(words, n, previous, previous_streak, streak,
                                      cfg.agree_min_probability, cfg.unsure_agree_decodes)
        return CommitDecision(n, tuple(streak), forced, tuple(commit))
    return CommitDecision(n, tuple(streak), forced, tuple(words[:n]))


def outvoted_at_deadline(words: Sequence[Word], n: int, previous: Sequence[Word],
                         previous_streak: Sequence[int], streak: Sequence[int],
                         min_probability: float, min_decodes: int) -> list[Word]:
    """Deadline mode: the ``n`` due words, but where this decode changed words that at least
    ``min_decodes`` decodes in a row agreed on and read surely (every word at least
    ``min_probability``), and it is itself unsure of its change (a word under
    ``min_probability``), the agreed reading commits in their place (as voted). Four decodes
    read "the Netherlands" (0.91-0.95); the one at the deadline, with 200 ms more audio after
    it, "nether lens" (0.51 / 0.16). A sure change ("old-sposed" -> "ill-disposed") is the
    right context at work, and stands; so does an unsure one against two decodes ("married
    him", 0.69 / 0.52, then "married a", 0.23, as said)."""
    span = _vote_span(words, n, previous, previous_streak, streak)
    if span is None:
        return list(words[:n])
    k, j, m = span
    if (m == k or min(previous_streak[k:j]) < min_decodes
            or min(w.probability for w in previous[k:j]) < min_probability
            or min(w.probability for w in words[k:m]) >= min_probability):
        return list(words[:n])
    return [*words[:k], *previous[k:j], *words[m:n]]  # due words after it commit as read


def voted(words: Sequence[Word], n: int, previous: Sequence[Word],
          previous_streak: Sequence[int], streak: Sequence[int]) -> tuple[list[Word], int]:
    """Agreement mode: the first ``n`` words commit without agreement (their age, the window's
    size). Where this decode just changed words that the two decodes before it agreed on (they
    were unsure of them: Whisper's probability under ``agree_min_probability``), those two
    readings outvote this one, and the words of theirs that end in the committed span commit
    instead. tiny.en read a sentence's first words "Unless to" in two decodes (0.07-0.26) and "I
    must" in the third, whose words then reached max_tentative_ms. Returns the words that commit
    and how many words of this hypothesis they account for."""
    span = _vote_span(words, n, previous, previous_streak, streak)
    if span is None:
        return list(words[:n]), n
    k, j, m = span
    return [*words[:k], *previous[k:j]], m


def _vote_span(words: Sequence[Word], n: int, previous: Sequence[Word],
               previous_streak: Sequence[int], streak: Sequence[int]
               ) -> tuple[int, int, int] | None:
    """Where the first ``n`` words of this decode changed words that decodes before it agreed
    on: ``(k, j, m)``, this decode's words from ``k`` differ, the agreed reading's
    ``previous[k:j]`` end in the span, and they stand for ``words[k:m]``; None if none did."""
    k = next((i for i in range(n) if streak[i] == 1), None)
    if k is None or k >= len(previous) or previous_streak[k] < 2:
        return None
    limit = words[n - 1].end_ns + VOTE_SLACK_MS * NS_PER_MS
    j = k
    while j < len(previous) and previous_streak[j] >= 2 and previous[j].end_ns <= limit:
        j += 1
    if j == k:
        return None
    # the words of this hypothesis that the voted reading covers (timing noise allowed)
    covered = previous[j - 1].end_ns + VOTE_SLACK_MS * NS_PER_MS
    m = k
    while m < n and words[m].end_ns <= covered:
        m += 1
    return k, j, m


def unread_from(words: Sequence[Word], previous: Sequence[Word]) -> int:
    """Deadline mode: from which of the last hypothesis's words ``previous`` (after the commit
    point) a new decode ``words`` stopped short of them; ``len(previous)``: it did not. Whisper
    ends a decode before speech at the window's end that it takes for an unfinished segment,
    as it leaves that to its next window offline; here that reading ("gave them" of "gave them
    warning that") would lose the words the last decode read after it: the tagger's right
    context (the speech after "them" read as a pause: "gave them. Warning"), and the due ones
    would wait for the next update. They stay, as they were read, until a decode reads that
    audio again, where the two readings meet on the new one's last word (its text, within
    3 x ``VOTE_SLACK_MS``): joined by time alone, they overlapped or disagreed there ("upon
    the" + "the morrow": "the the"; "a mane in" + "into the": "in to")."""
    if not words or not previous:
        return len(previous)
    last, slack_ns = words[-1], 3 * VOTE_SLACK_MS * NS_PER_MS
    meet = [i for i, w in enumerate(previous) if norm_word(w.text) == norm_word(last.text)
            and abs(w.end_ns - last.end_ns) <= slack_ns]
    if not meet:
        return len(previous)
    return min(meet, key=lambda i: abs(previous[i].end_ns - last.end_ns)) + 1
