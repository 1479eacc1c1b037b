"""A decode's words as the commit policy (subd.recognise.commit) sees them: on the stream's
clock, closing marks joined to their word, and none that re-state the committed audio
(``after_commit_point``: a copy of the committed tail, the rest of a word cut at the commit
point joined to it) or that Whisper wrote past the audio it heard (``stacked_tail_cut``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from subd.models.alignment import WordTiming
from subd.recognise.commit import NS_PER_MS, VOTE_SLACK_MS, norm_word
from subd.script import CLOSING, has_cjk
from subd.types import Word, ns_to_samples, samples_to_ns

STACKED_END_MS = 60  # see stacked_tail_cut
STACKED_MS = 10
SAID_AGAIN_SHARE = 0.6  # see _said_again
SAID_AGAIN_WORD_MS = 100  # a word said again lies on at least this much new audio (_said_again)
RESTART_WORDS = 3  # see restart_cut
RESTART_UNSURE = 0.3  # ... a word between under this probability was no speech either


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
                          joined=w.joined, mark_p=w.mark_p))
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
        if deadline:
            out = restart_cut(out, committed_end_ns)
    else:
        cut = committed_end_ns - 100 * NS_PER_MS
        out = [w for w in words if w.start_ns >= cut or w is rest]
    if not committed or not out or out[0].start_ns > committed_end_ns + 1_000 * NS_PER_MS:
        return out
    for n in _tail_copies(out, committed):
        if not (deadline and forced and _said_again(out[:n], committed[-n:])):
            return out[n:]
    return _restated_characters(out, committed)


def restart_cut(words: list[Word], committed_end_ns: int) -> list[Word]:
    """``words`` (those after a forced prefix) without a false start: Whisper may begin the
    new words, lose its place and begin again. LibriVox 3436 at D = 1 s, after the forced "and
    fields": "beside" on 40 ms, "Field," (0.24) on 100 ms, then "beside" on its own 340 ms and
    "Westminster": the first two were committed ("fields beside Field, beside Westminster").
    A first word on less than ``SAID_AGAIN_WORD_MS`` of audio after the commit point
    (``committed_end_ns``) that comes again within the next ``RESTART_WORDS`` words, every
    word between also that short or unsure (under ``RESTART_UNSURE``), was not said: the
    reading starts at its second copy. A speaker who says a word twice says the first one on
    audio of its own."""
    def short(w: Word) -> bool:
        return w.end_ns - max(w.start_ns, committed_end_ns) < SAID_AGAIN_WORD_MS * NS_PER_MS

    first = norm_word(words[0].text) if words else ""
    if not first or not short(words[0]):
        return words
    for j in range(1, min(len(words), RESTART_WORDS + 1)):
        if norm_word(words[j].text) == first:
            if all(short(w) or w.probability < RESTART_UNSURE for w in words[1:j]):
                return words[j:]
            break
    return words


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
    return replace(word, text=rest, joined=True)


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


def word_start_at(committed: Sequence[Word], sample: int) -> int:
    """The first sample of the committed word that ``sample`` falls inside, or ``sample`` where
    it falls between words: a window starting there hears that word whole (a decode from
    inside the committed "will" of "we will not go back" read "go back", without "not")."""
    at_ns = samples_to_ns(sample)
    for w in reversed(committed):
        if w.end_ns <= at_ns:
            break
        if w.start_ns <= at_ns:
            return min(sample, ns_to_samples(w.start_ns))
    return sample
