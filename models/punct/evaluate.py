"""Held-out scores of the punctuation tagger: precision/recall/F1 per mark and for capitals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .simulate import eval_marks, eval_stream
from .tagger import PunctTagger
from .text import SENTENCE_END, LabelledWord

EVAL_SEED = 1234


@dataclass(frozen=True, slots=True)
class PRF:
    name: str
    n_true: int
    n_pred: int
    n_hit: int

    @property
    def precision(self) -> float:
        return self.n_hit / self.n_pred if self.n_pred else 0.0

    @property
    def recall(self) -> float:
        return self.n_hit / self.n_true if self.n_true else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def row(self) -> str:
        return (f"| {self.name} | {self.precision:.3f} | {self.recall:.3f} | {self.f1:.3f} "
                f"| {self.n_true} |")


def score(
    true_punct: Sequence[str], pred_punct: Sequence[str],
    true_case: Sequence[str], pred_case: Sequence[str],
) -> list[PRF]:
    """P/R/F1 for '.', ',', '?', any sentence end (. ? !) and capitalised words (cap/UPPER)."""
    rows = []
    classes: list[tuple[str, frozenset[str]]] = [
        ("'.'", frozenset({"."})), ("','", frozenset({","})), ("'?'", frozenset({"?"})),
        ("sentence end (.?!)", SENTENCE_END),
    ]
    for name, marks in classes:
        t = [p in marks for p in true_punct]
        p = [q in marks for q in pred_punct]
        rows.append(PRF(name, sum(t), sum(p), sum(a and b for a, b in zip(t, p, strict=True))))
    t = [c != "lower" for c in true_case]
    p = [c != "lower" for c in pred_case]
    rows.append(PRF("capital", sum(t), sum(p), sum(a and b for a, b in zip(t, p, strict=True))))
    return rows


def evaluate_docs(
    tagger: PunctTagger | None, docs: Sequence[list[LabelledWord]], with_pauses: bool = True,
    with_marks: bool = False,
) -> tuple[list[PRF], int]:
    """Tag each held-out document as one stream; returns the scores and the word count.

    ``with_marks``: give the tagger simulated recogniser marks (fixed seed). ``tagger`` None
    scores those simulated marks themselves (the recogniser's own punctuation).
    """
    tp: list[str] = []
    pp: list[str] = []
    tc: list[str] = []
    pc: list[str] = []
    for i, doc in enumerate(docs):
        words, pauses, puncts, cases = eval_stream(doc, EVAL_SEED + i)
        marks = eval_marks(doc, pauses, EVAL_SEED + i)[0] if with_marks or tagger is None else None
        tp += puncts
        tc += cases
        if tagger is None and marks is not None:
            pp += [m.punct for m in marks]
            pc += [m.case for m in marks]
            continue
        tags = tagger.tag(words, pauses if with_pauses else None, right_context_complete=True,
                          recogniser=marks)
        pp += [t.punct for t in tags]
        pc += [t.case for t in tags]
    return score(tp, pp, tc, pc), len(tp)
