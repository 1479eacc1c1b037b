"""Measure what the real streaming recogniser does with punctuation, to calibrate simulate.py.

    python -m subd.bench.punct_calibrate --sessions 3 --seed 11

speaks paragraphs of *training* documents with espeak-ng (``spoken_sessions`` of
subd/bench/punct_e2e.py; never held-out text, never the book of the LibriVox clips), streams
them through ``StreamingRecognizer`` exactly as the daemon does, aligns the committed words to
the text and prints, by true mark: the marks Whisper wrote (only where it punctuated at all
within 12 words, and separately the share of words in stretches where it wrote none), the pause
after the word and the word's duration over what its letters predict (a line fitted to the
unmarked words). Slow: the recogniser runs
at about real time on one core.
"""

from __future__ import annotations

import argparse
import difflib
from collections import Counter
from dataclasses import dataclass

import numpy as np

from subd.models.punct.text import (
    PUNCTS,
    LabelledWord,
    label_text,
    normalise_word,
    recogniser_mark,
)

NS_PER_MS = 1_000_000
_PUNCTUATING_SPAN = 12  # a word is in a punctuating stretch if a mark lies within this many


@dataclass(frozen=True, slots=True)
class AlignedWord:
    """A committed recogniser word matched to the text: its true mark and what it showed."""

    true_punct: str
    rec_punct: str
    punctuating: bool  # the recogniser wrote some mark near this word
    n_after: int  # words decoded after it in the hypothesis that committed it
    pause_ms: float | None
    duration_ms: float
    word: str


def _labelled(paragraphs: tuple[tuple[str, str], ...]) -> list[LabelledWord]:
    out: list[LabelledWord] = []
    for _, text in paragraphs:
        words = label_text(text)
        if words and words[-1].punct == "":
            words[-1] = LabelledWord(words[-1].word, ".", words[-1].case)
        out += words
    return out


def align_session(hypotheses, paragraphs: tuple[tuple[str, str], ...]) -> list[AlignedWord]:
    """Committed words of one stream's hypotheses matched to the text they were spoken from."""
    ref = _labelled(paragraphs)
    words = []
    for hyp in hypotheses:
        n = len(hyp.committed) + len(hyp.tentative)
        words += [(w, n - 1 - i) for i, w in enumerate(hyp.committed)]
    marks = [recogniser_mark(w.text).punct for w, _ in words]
    norm = [normalise_word(w.text) for w, _ in words]
    matcher = difflib.SequenceMatcher(a=norm, b=[r.word for r in ref], autojunk=False)
    out = []
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            i, j = block.a + k, block.b + k
            w, n_after = words[i]
            nxt = words[i + 1][0].start_ns if i + 1 < len(words) else None
            near = marks[max(0, i - _PUNCTUATING_SPAN) : i + _PUNCTUATING_SPAN + 1]
            out.append(AlignedWord(
                ref[j].punct, marks[i], any(near), n_after,
                None if nxt is None else (nxt - w.end_ns) / NS_PER_MS,
                (w.end_ns - w.start_ns) / NS_PER_MS, norm[i]))
    return out


def align_tails(hypotheses, paragraphs: tuple[tuple[str, str], ...]) -> list[AlignedWord]:
    """Tentative words of every hypothesis, each matched to the committed word it became (same
    text, start within 400 ms) and so to the text; ``n_after`` counts the tentative words
    after it (0 = the last word of that decode). Pause and duration are not measured here."""
    ref = _labelled(paragraphs)
    committed = [w for hyp in hypotheses for w in hyp.committed]
    norm = [normalise_word(w.text) for w in committed]
    matcher = difflib.SequenceMatcher(a=norm, b=[r.word for r in ref], autojunk=False)
    truth: dict[int, str] = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            truth[block.a + k] = ref[block.b + k].punct
    by_text: dict[str, list[tuple[int, int]]] = {}
    for i, w in enumerate(committed):
        by_text.setdefault(norm[i], []).append((w.start_ns, i))
    out = []
    for hyp in hypotheses:
        for j, w in enumerate(hyp.tentative):
            word = normalise_word(w.text)
            match = [i for start, i in by_text.get(word, ())
                     if abs(start - w.start_ns) < 400 * NS_PER_MS and i in truth]
            if match:
                out.append(AlignedWord(truth[match[0]], recogniser_mark(w.text).punct, True,
                                       len(hyp.tentative) - 1 - j, None,
                                       (w.end_ns - w.start_ns) / NS_PER_MS, word))
    return out


def _by_words_after(rows: list[AlignedWord], title: str) -> list[str]:
    lines = [title]
    for t in PUNCTS:
        for n_after, name in ((0, "0"), (1, "1"), (2, "2+")):
            c = Counter(r.rec_punct for r in rows
                        if r.true_punct == t and min(r.n_after, 2) == n_after)
            n = sum(c.values())
            if n:
                lines.append(f"  {t or '_'} with {name:<2} words after, n={n}: " + " ".join(
                    f"{k or '_'} {c[k] / n:.2f}" for k in PUNCTS))
    return lines


def report(rows: list[AlignedWord], tails: list[AlignedWord] = ()) -> str:
    plain = np.array([(len(r.word), r.duration_ms) for r in rows if r.true_punct == ""], float)
    per_char, base = np.polyfit(plain[:, 0], plain[:, 1], 1) if len(plain) > 2 else (0.0, 1.0)

    def expected_duration_ms(word: str) -> float:
        return max(1.0, base + per_char * len(word))

    lines = [f"{len(rows)} aligned words; in stretches without any mark: "
             f"{sum(not r.punctuating for r in rows)}"]
    lines.append("true mark -> recogniser's mark (punctuating stretches):")
    for t in PUNCTS:
        c = Counter(r.rec_punct for r in rows if r.true_punct == t and r.punctuating)
        n = sum(c.values())
        if n:
            lines.append(f"  {t or '_'} n={n}: " + " ".join(
                f"{k or '_'} {c[k] / n:.3f}" for k in PUNCTS))
    lines.append("pause after (ms) and duration / expected, p10 p25 p50 p75 p90:")
    for t in PUNCTS:
        pauses = [r.pause_ms for r in rows if r.true_punct == t and r.pause_ms is not None]
        ratios = [r.duration_ms / expected_duration_ms(r.word) for r in rows if r.true_punct == t]
        if pauses:
            q = np.percentile(pauses, [10, 25, 50, 75, 90]).round().tolist()
            d = np.percentile(ratios, [10, 25, 50, 75, 90]).round(2).tolist()
            lines.append(f"  {t or '_'} n={len(pauses)}: pause {q}  duration {d}")
    if len(plain) > 2:
        lines.append(f"unmarked words: duration ~ {base:.0f} ms + {per_char:.1f} ms per letter")
    lines += _by_words_after(rows, "committed words: true mark -> recogniser's mark, by words "
                                   "decoded after the word when it was committed:")
    if tails:
        lines += _by_words_after(list(tails), "tentative words: true mark -> recogniser's mark, "
                                              "by tentative words after it in that decode:")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from subd.bench.punct_e2e import spoken_sessions
    from subd.models.engine import WhisperEngine
    from subd.recognise.streaming import StreamingRecognizer
    from subd.scoring.punct import stream_hypotheses

    p = argparse.ArgumentParser(prog="python -m subd.bench.punct_calibrate")
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--deadline-context-ms", type=int, default=0,
                   help="decide as the daemon does (deadline mode, Whisper's full input): "
                        "each update commits the words ending this long before its audio end "
                        "(D = 2 s on one core gives ~1200); 0: agreement alone")
    args = p.parse_args(argv)
    engine = WhisperEngine.load("tiny.en", threads=1, quantize=True)
    rows: list[AlignedWord] = []
    tails: list[AlignedWord] = []
    context_ns = args.deadline_context_ms * NS_PER_MS or None
    for session in spoken_sessions(False, args.sessions, args.seed):
        hyps = stream_hypotheses(StreamingRecognizer(engine=engine), session.audio,
                                 deadline_context_ns=context_ns)
        rows += align_session(hyps, session.paragraphs)
        tails += align_tails(hyps, session.paragraphs)
    print(report(rows, tails))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
