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
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from subd.models.alignment import WordTiming
from subd.script import CLOSING, has_cjk
from subd.types import Word

NS_PER_MS = 1_000_000
STACKED_END_MS = 60  # see stacked_tail_cut
STACKED_MS = 10
VOTE_SLACK_MS = 100  # word times move by ±100 ms between decodes (DTW): voted, _said_again
SAID_AGAIN_SHARE = 0.6  # see _said_again
SAID_AGAIN_WORD_MS = 100  # a word said again lies on at least this much new audio (_said_again)


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


def hypothesis_words(timings: Sequence[WordTiming], offset_ns: int) -> list[Word]:
    """A decode's timed words on the stream's clock (``offset_ns``: the window's start). A
    closing mark alone (".", "?", "，") is no word: it closes the word before it. Alone at a
    decode's start (Whisper's "." for a stream's first breath) it was committed as a word,
    forced into every later prefix, and the stream's first word was lost (". Mr John"). Other
    symbols ("&", "-") stay words."""
    words: list[Word] = []
    for w in timings:
        text = w.text.strip()
        if not text:
            continue
        if all(ch in CLOSING for ch in text):
            if words:
                words[-1] = replace(words[-1], text=words[-1].text + text)
            continue
        words.append(Word(text=text, start_ns=offset_ns + int(w.start_s * 1e9),
                          end_ns=offset_ns + int(w.end_s * 1e9), probability=w.probability,
                          joined=w.joined))
    return words


def after_commit_point(words: list[Word], committed: Sequence[Word], committed_end_ns: int,
                       forced: bool = False, deadline: bool = False) -> list[Word]:
    """Drop hypothesis words that re-state committed audio (Whisper repeats its context).

    Word times move by ±100 ms between decodes, so the cut is by start time with a margin,
    and then by text: a leading 1–5-gram equal to the committed tail is removed, unless it
    was said again (``_said_again``; asked after a forced prefix in ``deadline`` mode only, where
    ``stacked_tail_cut`` has removed looped copies: driven alone they passed it, "Five. Five.
    Five. ..."; without a prefix Whisper re-reads the committed audio, and DTW timed a re-read
    我想 on the audio after it). After a
    ``forced`` prefix (the committed words) every decoded word is new: only a word lying
    wholly inside committed audio is dropped, since a start 100 ms earlier than the
    committed end is timing noise, not a repeat (dropping it loses the word).
    """
    rest = None
    first = next((i for i, w in enumerate(words) if w.end_ns > committed_end_ns), None)
    if committed and first is not None:
        rest = _rest_of_cut_word(words[first], committed[-1])
        if rest is words[first]:
            rest = None
        else:
            words = [*words[:first], rest, *words[first + 1:]]
    if forced:
        out = [w for w in words if w.end_ns > committed_end_ns
               or deadline and w.start_ns >= committed_end_ns]  # no duration, at the end
    else:
        cut = committed_end_ns - 100 * NS_PER_MS
        out = [w for w in words if w.start_ns >= cut or w is rest]
    if not committed or not out or out[0].start_ns > committed_end_ns + 1_000 * NS_PER_MS:
        return out
    for n in _tail_copies(out, committed):
        if not (deadline and forced and _said_again(out[:n], committed[-n:])):
            return out[n:]
    return _restated_characters(out, committed)


def _tail_copies(words: Sequence[Word], committed: Sequence[Word]) -> Iterator[int]:
    """Each n (5 down to 1) for which the first n of ``words`` say the committed tail's last
    n words again (case and marks aside)."""
    tail = [norm_word(w.text) for w in committed[-5:]]
    for n in range(min(5, len(words), len(tail)), 0, -1):
        if [norm_word(w.text) for w in words[:n]] == tail[-n:]:
            yield n


def restated_tail_dropped(words: Sequence[Word], committed: Sequence[Word]) -> list[Word]:
    """``words`` without their leading copies of the committed tail's last 1-5 words, however
    many times over: a stream's final decode (Whisper's full input, every word of the audio
    heard) reads its last word once, and copies of it that an earlier decode looped over that
    word's audio ("objective. That objective. That objective.", base at D = 2 s) are no word it
    left out."""
    out = list(words)
    while n := next(_tail_copies(out, committed), 0):
        out = out[n:]
    return out


def _restated_characters(out: list[Word], committed: Sequence[Word]) -> list[Word]:
    """Chinese and Japanese: a decode re-stating the committed tail may group its characters
    into other words: "認為" committed, then "认" (dropped by time) and "为" squeezed against
    the commit point in the next decode ("我认为为跑步"). Leading words whose characters end
    the committed text, but are not its last words, are dropped, unless they were said again
    (``_said_again``: a repeated character lies on audio of its own)."""
    if not has_cjk(out[0].text):
        return out
    said = "".join(norm_word(w.text) for w in committed[-5:])
    for n in range(min(5, len(out)), 0, -1):
        copy = "".join(norm_word(w.text) for w in out[:n])
        if not copy or not said.endswith(copy):
            continue
        k, chars = 0, 0  # the committed words the copy re-states
        while chars < len(copy):
            k += 1
            chars += len(norm_word(committed[-k].text))
        if not _said_again(out[:n], committed[-k:]):
            return out[n:]
    return out


def _said_again(copy: Sequence[Word], said: Sequence[Word]) -> bool:
    """Is ``copy``, the committed words ``said`` in text, the speaker saying them again?

    A copy that Whisper re-states from its context overlaps the committed audio or is squeezed
    against the commit point (a forced prefix's last word with only a mark after it, "again"
    then "again.", no longer comes back: models.alignment.words_from_path); one that was said
    again starts after it and lies on audio about as long as the first time ("we will not go
    back, we will not go back": the fourth copy of a chant was dropped as a re-statement).
    "As long" needs a floor: DTW gives a word squeezed between two others 20 ms ("so am I":
    "I" committed on 20 ms), and 0.6 of that let a re-stated "I" through on 20 ms of new audio
    ("so am I I fellow"). DTW also swallows the pause after a phrase into its last word, so
    the first time is measured up to its last word's start, plus the shorter of the two last
    words ("recalled the words, the words of": "words," ran on over the pause, 0.58 s, and the
    copy said 0.14 s later was dropped)."""
    if copy[0].start_ns < said[-1].end_ns - VOTE_SLACK_MS * NS_PER_MS:
        return False
    fresh = copy[-1].end_ns - max(copy[0].start_ns, said[-1].end_ns)
    last = min(said[-1].end_ns - said[-1].start_ns, copy[-1].end_ns - copy[-1].start_ns)
    first_time = said[-1].start_ns - said[0].start_ns + last
    return fresh >= max(SAID_AGAIN_SHARE * first_time,
                        SAID_AGAIN_WORD_MS * NS_PER_MS * len(copy)) > 0


def _rest_of_cut_word(word: Word, last: Word) -> Word:
    """A word committed at its deadline may have been a cut-off start of a longer one ("ill"
    of "ill-disposed"): when the next decode spells the whole word right after it, only the
    rest is new ("-disposed", joined to "ill": shown "ill-disposed"), not the word again ("ill
    ill-disposed")."""
    head, text = norm_word(last.text), word.text.strip()
    if not head or word.start_ns > last.end_ns + 200 * NS_PER_MS:
        return word
    letters = [i for i, ch in enumerate(text) if ch.isalnum() or ch == "'"]
    if len(letters) <= len(head) or norm_word(text[:letters[len(head) - 1] + 1]) != head:
        return word
    rest = text[letters[len(head) - 1] + 1:]
    if not rest.startswith("-") or not norm_word(rest):
        return word  # "Fives" after "Five" is another word, not the rest of it
    return Word(rest, word.start_ns, word.end_ns, word.probability, joined=True)


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


def stacked_tail_cut(words: list[Word], end_ns: int) -> list[Word]:
    """Drop the words Whisper wrote past the audio it heard. On a cut window it can loop a
    phrase ("Ten of clubs. Ten of clubs. Ten of ...", the cards clips at D = 1 s), every copy
    timed at the window's very end or stacked at one instant before a real word. Two words
    cannot both end within ``STACKED_END_MS`` of the audio end, nor two words of no duration
    at the same instant: the first of each such run is kept (it may be a real word, cut
    short) unless the word after the run repeats it, the rest are not speech. Before any such run,
    one word of no duration between two real ones is a short word DTW squeezed ("no, we
    will": "we" at the instant "no," ends), and stays.

    Deadline mode only: under agreement a copy is never heard out, so it never commits, and the
    CRF read a loop's repeated sentence start as right context (subd bench punct-e2e, driven
    alone: sentence F1 0.44 with the loops in the tentative tail, 0.35 without)."""
    near = end_ns - STACKED_END_MS * NS_PER_MS
    i = len(words)
    while i > 0 and words[i - 1].end_ns >= near:
        i -= 1
    if len(words) - i > 1:
        words = words[:i + 1]
    out: list[Word] = []
    stacked = False  # words were dropped after out[-1]
    looped = False  # two words of no duration at one instant: every later one is a copy
    dropped_end = 0  # where the last word dropped ends
    for i, w in enumerate(words):
        if out and _instant(w, out[-1].end_ns):
            looped |= i > 0 and _instant(words[i - 1], w.end_ns) or \
                i + 1 < len(words) and _instant(words[i + 1], w.end_ns)
            if looped:
                stacked = True  # no duration, at the instant the word before ends
                dropped_end = w.end_ns
                continue
        if stacked and _squeezed_copy(w, dropped_end):
            dropped_end = w.end_ns
            continue
        if stacked and norm_word(out[-1].text) == norm_word(w.text):
            out.pop()  # the loop's first word, the real one follows ("Seven [of clubs] Seven")
        stacked = False
        out.append(w)
    return out


def _squeezed_copy(word: Word, at_ns: int) -> bool:
    """A word of a loop that the alignment gave a sliver of time: under ``SAID_AGAIN_WORD_MS``,
    starting where the dropped copies end. A decode on libri-2412 restated the whole
    transcript from the window's start, every word at one instant but "design," (80 ms), which
    went out twice ("in my design, design, and that")."""
    return word.end_ns - word.start_ns < SAID_AGAIN_WORD_MS * NS_PER_MS and \
        abs(word.start_ns - at_ns) < STACKED_MS * NS_PER_MS


def _instant(word: Word, at_ns: int) -> bool:
    """A word of no duration at ``at_ns``."""
    return word.end_ns - word.start_ns < STACKED_MS * NS_PER_MS and \
        abs(word.end_ns - at_ns) < STACKED_MS * NS_PER_MS
