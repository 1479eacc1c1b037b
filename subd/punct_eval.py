"""End-to-end punctuation scoring: subd's tagger vs the recogniser's own marks, same stream.

One streaming run of the recogniser over speech with a punctuated reference gives, per committed
word, the recogniser's own mark (Whisper's punctuation) and the CRF tagger's mark (fed the same
hypotheses through :class:`subd.punct_stream.PunctStream`). Both word sequences are aligned to
the reference words; precision/recall/F1 are counted per mark and for sentence boundaries
(any of . ? !). A *chunk-edge break* is a sentence-end mark on the last word of a commit batch
where the reference has none: the classic streaming error ("and then. asked ...").
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import numpy as np

from subd.types import SAMPLE_RATE_HZ, AudioChunk

SENTENCE_END = (".", "?", "!")
MARKS = (".", ",", "?")
_MAP = {":": ",", ";": ",", "!": "!", ".": ".", ",": ",", "?": "?"}
# A title's full stop ("Mr.") is not a sentence boundary, in the reference or in the output.
_TITLES = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs"})


def reference_words(text: str) -> list[tuple[str, str]]:
    """Punctuated text -> [(normalised word, mark after it)]; ':'/';' count as ','."""
    out: list[tuple[str, str]] = []
    for token in text.split():
        m = re.match(r"^[\"'(\[]*(.*?)([.,?!:;\"')\]-]*)$", token)
        word, trail = m.group(1), m.group(2)
        mark = next((_MAP[c] for c in trail if c in _MAP), "")
        if mark == "." and trail.startswith(".") and _norm(word) in _TITLES:
            mark = ""
        for i, part in enumerate(p for p in re.split(r"-+", word) if p):
            last = i == len([p for p in re.split(r"-+", word) if p]) - 1
            out.append((_norm(part), mark if last else ""))
    return out


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9']", "", word.lower())


def split_marked(text: str) -> list[tuple[str, str]]:
    """A recognised word with its own punctuation -> [(normalised word, mark)] (hyphens split)."""
    return reference_words(text)


@dataclass(slots=True)
class Scores:
    tp: dict[str, int] = field(default_factory=dict)
    fp: dict[str, int] = field(default_factory=dict)
    fn: dict[str, int] = field(default_factory=dict)
    chunk_edge_breaks: int = 0
    chunk_edges: int = 0

    def add(self, key: str, predicted: bool, truth: bool) -> None:
        for table, hit in (
            (self.tp, predicted and truth),
            (self.fp, predicted and not truth),
            (self.fn, truth and not predicted),
        ):
            table[key] = table.get(key, 0) + int(hit)

    def add_scores(self, other: Scores) -> None:
        """Pool ``other``'s counts into these (several streams scored as one)."""
        for mine, theirs in ((self.tp, other.tp), (self.fp, other.fp), (self.fn, other.fn)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        self.chunk_edge_breaks += other.chunk_edge_breaks
        self.chunk_edges += other.chunk_edges

    def f1(self, key: str) -> tuple[float, float, float]:
        tp, fp, fn = self.tp.get(key, 0), self.fp.get(key, 0), self.fn.get(key, 0)
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def score(hyp: list[tuple[str, str, bool]], ref: list[tuple[str, str]]) -> Scores:
    """``hyp``: (normalised word, mark, is a chunk edge); only words matched to ``ref`` count."""
    s = Scores()
    matcher = difflib.SequenceMatcher(
        a=[w for w, _, _ in hyp], b=[w for w, _ in ref], autojunk=False
    )
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            _, mark, edge = hyp[block.a + k]
            truth = ref[block.b + k][1]
            for m in MARKS:
                s.add(m, mark == m, truth == m)
            s.add("sentence", mark in SENTENCE_END, truth in SENTENCE_END)
            if edge:
                s.chunk_edges += 1
                s.chunk_edge_breaks += int(mark in SENTENCE_END and truth not in SENTENCE_END)
    return s


def stream_hypotheses(
    recognizer, audio: np.ndarray, step_samples: int = SAMPLE_RATE_HZ // 2
) -> list:
    """One streaming run: the hypothesis after each ``step_samples`` of audio, and at the end."""
    hyps = []
    for start in range(0, len(audio), step_samples):
        recognizer.accept(AudioChunk(start, audio[start : start + step_samples]))
        hyps.append(recognizer.update())
    hyps.append(recognizer.finish())
    return hyps


def stream_both(
    recognizer, tagger_stream, audio: np.ndarray, step_samples: int = SAMPLE_RATE_HZ // 2
):
    """Run one stream; return (recogniser's marked words, tagger's marked words) with edges."""
    own: list[tuple[str, str, bool]] = []
    tagged: list[tuple[str, str, bool]] = []
    edge_words: set[tuple[int, str]] = set()  # (start_ns, text) of words ending a commit batch

    def key(w) -> tuple[int, str]:
        return (w.start_ns, w.text)

    def consume(hyp, final_update) -> None:
        if hyp.committed:
            edge_words.add(key(hyp.committed[-1]))
        for w in hyp.committed:
            parts = split_marked(w.text)
            for i, (word, mark) in enumerate(parts):
                own.append((word, mark, key(w) in edge_words and i == len(parts) - 1))
        for t in final_update.final:
            parts = split_marked(t.text + t.punct)
            for i, (word, mark) in enumerate(parts):
                tagged.append((word, mark, key(t.word) in edge_words and i == len(parts) - 1))

    for start in range(0, len(audio), step_samples):
        recognizer.accept(AudioChunk(start, audio[start : start + step_samples]))
        hyp = recognizer.update()
        consume(hyp, tagger_stream.update_from(hyp))
    hyp = recognizer.finish()
    upd = tagger_stream.update_from(hyp)
    consume(hyp, upd)
    flushed = tagger_stream.flush(hyp.audio_end_ns)
    for t in flushed.final:
        for word, mark in split_marked(t.text + t.punct):
            tagged.append((word, mark, False))
    return own, tagged
