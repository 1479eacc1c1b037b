"""End-to-end punctuation scoring: subd's tagger vs the recogniser's own marks, same stream.

One streaming run of the recogniser over speech with a punctuated reference gives, per committed
word, the recogniser's own mark (Whisper's punctuation) and the CRF tagger's mark (fed the same
hypotheses through :class:`subd.punct.stream.PunctStream`). Both word sequences are aligned to
the reference words; precision/recall/F1 are counted per mark and for sentence boundaries
(any of . ? !). A *chunk-edge break* is a sentence-end mark on the last word of a commit batch
where the reference has none: the classic streaming error ("and then. asked ..."). They are
counted apart by what the reference has there: no mark at all (a phrase the reference keeps
whole: issue 4's acceptance count) or a clause mark (, ; : or a dash).

A streaming run costs minutes of CPU; ``cached_hypotheses`` keeps each run's hypotheses, keyed
by the audio and the recogniser's source code, so tagger variants are scored in seconds.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from subd.types import SAMPLE_RATE_HZ, AudioChunk, Hypothesis, Word

SENTENCE_END = (".", "?", "!")
MARKS = (".", ",", "?")
_MAP = {":": ",", ";": ",", "!": "!", ".": ".", ",": ",", "?": "?", "\u2014": ",", "\u2013": ","}
_DASH = re.compile(r"\s*(?:\u2014|\u2013|--+|\s-\s)\s*")  # a dash between words: a clause mark
# A title's full stop ("Mr.") is not a sentence boundary, in the reference or in the output.
_TITLES = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs"})


def reference_words(text: str, semicolons: bool = False) -> list[tuple[str, str]]:
    """Punctuated text -> [(normalised word, mark after it)]; ':', ';' and a dash between
    words count as ',' (``semicolons``: ';' is kept, for scorers that tell it apart)."""
    out: list[tuple[str, str]] = []
    for token in _DASH.sub("\u2014 ", text).split():
        m = re.match(r"^[\"'(\[]*(.*?)([.,?!:;\"')\]\u2014-]*)$", token)
        word, trail = m.group(1), m.group(2)
        mark = next((";" if semicolons and c == ";" else _MAP[c] for c in trail if c in _MAP), "")
        if mark == "." and trail.startswith(".") and _norm(word) in _TITLES:
            mark = ""
        if not _norm(word):  # marks alone ("\u2014" after a space): they follow the word before
            if out and mark and not out[-1][1]:
                out[-1] = (out[-1][0], mark)
            continue
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
    chunk_edge_breaks: int = 0  # false sentence ends on a chunk-edge word, all of them
    chunk_edges: int = 0
    edge_breaks_inside_phrase: int = 0  # ... where the reference has no mark at all
    edge_breaks_at_clause: int = 0  # ... where it has a clause mark (, ; : dash)

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
        self.edge_breaks_inside_phrase += other.edge_breaks_inside_phrase
        self.edge_breaks_at_clause += other.edge_breaks_at_clause

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
                if mark in SENTENCE_END and truth not in SENTENCE_END:
                    s.chunk_edge_breaks += 1
                    s.edge_breaks_inside_phrase += truth == ""
                    s.edge_breaks_at_clause += truth != ""
    return s


def _aligned(hyp: list[tuple[str, str, bool]], ref: list[tuple[str, str]]) -> dict:
    """Reference index -> the hypothesis word matched to it."""
    matcher = difflib.SequenceMatcher(
        a=[w for w, _, _ in hyp], b=[w for w, _ in ref], autojunk=False
    )
    return {block.b + k: hyp[block.a + k]
            for block in matcher.get_matching_blocks() for k in range(block.size)}


def boundary_errors(
    own: list[tuple[str, str, bool]], tagged: list[tuple[str, str, bool]],
    ref: list[tuple[str, str]],
) -> list[str]:
    """One line per reference word where the recogniser or the tagger is wrong about a sentence
    boundary: both marks ('~' = word not recognised), which output had it at a chunk edge, and
    the reference around it."""
    by_own, by_tag = _aligned(own, ref), _aligned(tagged, ref)
    lines = []
    for j, (_, truth) in enumerate(ref):
        o, t = by_own.get(j), by_tag.get(j)
        end = truth in SENTENCE_END
        wrong_own = o is not None and (o[1] in SENTENCE_END) != end
        wrong_tag = t is not None and (t[1] in SENTENCE_END) != end
        if not (wrong_own or wrong_tag or (end and (o is None or t is None))):
            continue
        edges = [name for name, x in (("recogniser", o), ("subd", t)) if x is not None and x[2]]
        before = " ".join(w + m for w, m in ref[max(0, j - 6) : j + 1])
        after = " ".join(w + m for w, m in ref[j + 1 : j + 4])
        lines.append(
            f"ref '{truth or '_'}' recogniser '{o[1] or '_' if o else '~'}' subd "
            f"'{t[1] or '_' if t else '~'}'{' edge: ' + '+'.join(edges) if edges else ''}: "
            f"{before} | {after}"
        )
    return lines


def stream_hypotheses(
    recognizer, audio: np.ndarray, step_samples: int = SAMPLE_RATE_HZ // 2,
    deadline_context_ns: int | None = None,
) -> list:
    """One streaming run: the hypothesis after each ``step_samples`` of audio, and at the end.
    ``deadline_context_ns``: deadline mode on Whisper's full input, as the pipeline drives it
    (subd.pipeline.deadline), every word decided with this much audio heard after it."""
    hyps = []
    for start in range(0, len(audio), step_samples):
        recognizer.accept(AudioChunk(start, audio[start : start + step_samples]))
        if deadline_context_ns is None:
            hyps.append(recognizer.update())
        else:
            end_ns = recognizer.audio_end_ns
            hyps.append(recognizer.update(max(0, end_ns - deadline_context_ns), full_span=True))
    hyps.append(recognizer.finish())
    return hyps


# The code that turns audio into hypotheses: a change to any of these files invalidates cached
# streaming runs (the model weights are named by the recogniser's model name).
_RECOGNISER_FILES = (
    "subd/recognise/streaming.py", "subd/recognise/vad.py", "subd/history.py", "subd/types.py",
    "subd/recognise/commit.py", "subd/recognise/loops.py", "subd/recognise/settle.py",
    "subd/recognise/language.py", "subd/recognise/cjk_policy.py", "models/engine.py",
    "models/alignment.py", "models/decoding.py", "models/loading.py", "models/whisper.py",
    "models/tokenizer.py", "kernels/mel.py",
)
_CACHE_FORMAT = 2  # 2: each word row ends with Word.joined


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "subd" / "punct-e2e"


@functools.cache
def recogniser_code_hash() -> str:
    """SHA-256 over the recogniser's source files (as installed: subd.models -> models/), read
    once per process: the code that was imported, not an edit made while it runs."""
    import subd
    import subd.kernels
    import subd.models

    roots = {m.__name__.removeprefix("subd.") if m is not subd else "subd":
             Path(m.__file__).parent for m in (subd, subd.models, subd.kernels)}
    h = hashlib.sha256()
    for rel in _RECOGNISER_FILES:
        top, _, rest = rel.partition("/")
        path = roots[top] / rest
        h.update(rel.encode() + b"\0" + (path.read_bytes() if path.exists() else b"-") + b"\0")
    return h.hexdigest()


def _hyp_to_json(h: Hypothesis) -> dict:
    def words(ws: tuple[Word, ...]) -> list:
        return [[w.text, w.start_ns, w.end_ns, w.probability, w.joined] for w in ws]

    return {"c": words(h.committed), "t": words(h.tentative), "end": h.audio_end_ns}


def _hyp_from_json(d: dict) -> Hypothesis:
    def words(rows: list) -> tuple[Word, ...]:
        return tuple(Word(str(t), int(s), int(e), float(p), bool(j)) for t, s, e, p, j in rows)

    return Hypothesis(words(d["c"]), words(d["t"]), int(d["end"]))


def cached_hypotheses(
    audio: np.ndarray, make_recognizer: Callable[[], object], cache_dir: Path | None,
    model: str = "tiny.en", step_samples: int = SAMPLE_RATE_HZ // 2,
) -> list[Hypothesis]:
    """``stream_hypotheses`` of a fresh recogniser, read from ``cache_dir`` when this audio was
    streamed before by the same recogniser code; ``cache_dir`` None: always run it."""
    if cache_dir is None:
        return stream_hypotheses(make_recognizer(), audio, step_samples)
    key = hashlib.sha256()
    key.update(np.ascontiguousarray(audio, dtype=np.float32).tobytes())
    key.update(f"{_CACHE_FORMAT}/{model}/{step_samples}/{recogniser_code_hash()}".encode())
    path = Path(cache_dir) / f"{key.hexdigest()[:32]}.json"
    try:
        return [_hyp_from_json(d) for d in json.loads(path.read_text())]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not cached (or unreadable): run the recogniser
    hyps = stream_hypotheses(make_recognizer(), audio, step_samples)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps([_hyp_to_json(h) for h in hyps]))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache is no reason to fail the benchmark
    return hyps


def stream_both(
    recognizer, tagger_stream, audio: np.ndarray, step_samples: int = SAMPLE_RATE_HZ // 2
):
    """Run one stream; return (recogniser's marked words, tagger's marked words) with edges."""
    return replay(stream_hypotheses(recognizer, audio, step_samples), tagger_stream)


def replay(hypotheses, tagger_stream):
    """Feed one stream's hypotheses (the last one from ``finish``) to ``tagger_stream``;
    return (recogniser's marked words, tagger's marked words), each (word, mark, is an edge).

    The recogniser never sees the tagger, so recorded hypotheses replay exactly as live."""
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

    for hyp in hypotheses:
        consume(hyp, tagger_stream.update_from(hyp))
    if hypotheses:
        for t in tagger_stream.flush(hypotheses[-1].audio_end_ns).final:
            for word, mark in split_marked(t.text + t.punct):
                tagged.append((word, mark, False))
    return own, tagged
