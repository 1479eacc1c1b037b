"""``subd bench punct``: held-out precision/recall/F1 and ms per word of the punctuation tagger.

Held-out documents come from the same offline packages as training (split by document, see
models/punct/corpus.py); pauses and the recogniser's own marks are simulated from the true marks
under a fixed seed (models/punct/simulate.py). The streaming part feeds held-out text through
PunctStream in the simulated commit batches with a tentative tail, with and without the
recogniser's marks (the last tentative word of each update spelled with the full stop Whisper
closes its decodes with), and counts sentence ends at commit edges that the text does not have.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from subd.errors import UserError
from subd.types import Word

NS_PER_MS = 1_000_000


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("punct", help="punctuation tagger: held-out F1 and ms/word")
    p.add_argument("--model", type=Path, default=None, help="model directory (default: packaged)")
    p.add_argument("--max-words", type=int, default=60_000,
                   help="held-out words for the streaming run (default 60000)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.set_defaults(func=run)


def _timed_words(words: list[str], pauses_ms: list[float], marks=None) -> list[Word]:
    """Words on a timeline; with ``marks`` spelled as the recogniser wrote them ("Them.")."""
    from subd.models.punct.text import apply_case

    out = []
    t_ns = 0
    rng = random.Random(7)
    for i, (w, pause) in enumerate(zip(words, pauses_ms, strict=True)):
        dur_ns = int((120 + 45 * len(w) + rng.uniform(-40, 40)) * NS_PER_MS)
        text = w if marks is None else apply_case(w, marks[i].case) + marks[i].punct
        out.append(Word(text, t_ns, t_ns + dur_ns))
        t_ns += dur_ns + int(pause * NS_PER_MS)
    return out


def _stream(
    tagger, words: list[Word], truth: list[str], batches, use_marks: bool, naive: bool = False
) -> tuple[list[str], int, int, float]:
    """Feed ``words`` in the commit ``batches``; returns final marks, edge errors, updates, s.

    ``naive``: instead of PunctStream, decide each update's committed words at once with the
    right context there is (the tentative tail), as a recogniser does at its window edges:
    the baseline that waiting for right context replaces.
    """
    from subd.models.punct import SENTENCE_END, tag_words
    from subd.punct.stream import PunctConfig, PunctStream

    stream = PunctStream(tagger, PunctConfig(recogniser_marks=use_marks))
    marks: list[str] = []
    edges: list[int] = []
    i = 0
    t0 = time.perf_counter()
    for batch in batches:
        committed = words[i : i + batch.n_words]
        tentative = words[i + batch.n_words : i + batch.n_words + batch.n_tentative]
        if use_marks and tentative and not tentative[-1].text.endswith("?"):
            # Whisper closes its decode with a full stop, whatever the word's true mark
            last = tentative[-1]
            tentative = [*tentative[:-1],
                         Word(last.text.rstrip(".,!") + ".", last.start_ns, last.end_ns)]
        i += len(committed)
        edges.append(i - 1)
        audio_end = (tentative[-1] if tentative else committed[-1]).end_ns + 150 * NS_PER_MS
        if batch.at_pause:
            audio_end = max(audio_end, words[i].start_ns if i < len(words) else audio_end)
        if naive:
            chunk = [*words[max(0, i - 24) : i], *tentative]
            tags = tag_words(tagger, chunk, right_context_complete=False, after_last_ns=audio_end,
                             use_marks=use_marks)
            marks += [t.punct for t in tags[len(chunk) - len(tentative) - len(committed) :][
                : len(committed)]]
        else:
            marks += [t.punct for t in stream.update(committed, tentative, audio_end).final]
    if not naive:
        marks += [t.punct for t in stream.flush().final]
    seconds = time.perf_counter() - t0
    edge_errors = sum(marks[e] in SENTENCE_END and truth[e] not in SENTENCE_END for e in edges)
    return marks, edge_errors, len(batches), seconds


def _table(title: str, rows) -> None:
    print(f"\n{title}")
    print("| class | precision | recall | F1 | n true |\n|---|---|---|---|---|")
    for r in rows:
        print(r.row())


def run(args: argparse.Namespace) -> int:
    import torch

    from subd.models.punct import SENTENCE_END, PunctTagger
    from subd.models.punct.evaluate import EVAL_SEED, evaluate_docs, score
    from subd.models.punct.simulate import eval_marks, eval_stream
    from subd.models.punct.train import load_split

    if not 1 <= args.threads <= 64:
        raise UserError(f"--threads must be 1..64, got {args.threads}")
    torch.set_num_threads(args.threads)
    tagger = PunctTagger.load(args.model)
    try:
        data = load_split(seed=1)
    except FileNotFoundError as exc:
        raise UserError(f"bench punct: {exc}") from None
    for note in data.missing:
        print(f"source missing (install it for full figures): {note}")
    docs = [doc for source in sorted(data.held_out) for doc in data.held_out[source]]
    t0 = time.perf_counter()
    rows, n_words = evaluate_docs(tagger, docs, with_pauses=True)
    batch_s = time.perf_counter() - t0
    print(f"held-out: {len(docs)} documents, {n_words} words "
          f"({', '.join(sorted(data.held_out))})")
    _table("words + simulated pauses, whole documents (right context complete):", rows)
    _table("text only (no pauses):", evaluate_docs(tagger, docs, with_pauses=False)[0])
    _table("words + pauses + simulated recogniser marks:",
           evaluate_docs(tagger, docs, with_pauses=True, with_marks=True)[0])
    _table("the simulated recogniser marks themselves:", evaluate_docs(None, docs)[0])

    # Streaming: the committer over a bounded sample of held-out text, in simulated batches.
    words: list[str] = []
    pauses: list[float] = []
    puncts: list[str] = []
    rec_marks = []
    batches = []
    for i, doc in enumerate(docs):
        take = max(200, args.max_words // len(docs))
        w, p, pu, _ = eval_stream(doc[:take], EVAL_SEED + i)
        m, b = eval_marks(doc[:take], p, EVAL_SEED + i)
        words += w
        pauses += p
        puncts += pu
        rec_marks += m
        batches += b
    plain = _timed_words(words, pauses)
    spelled = _timed_words(words, pauses, rec_marks)
    print(f"\nstreaming ({len(words)} words, {len(batches)} updates of simulated commit batches "
          "+ tentative words), sentence end (.?!):")
    print("| input | decided | precision | recall | F1 | false ends at commit edges |\n"
          "|---|---|---|---|---|---|")
    stream_s = 0.0
    for use_marks, timed in ((False, plain), (True, spelled)):
        name = "words + pauses + recogniser marks" if use_marks else "words + pauses"
        for naive in (False, True):
            got, errors, n_updates, secs = _stream(tagger, timed, puncts, batches, use_marks,
                                                   naive)
            r = score(puncts, got, puncts, puncts)[3]
            how = "at once, no waiting" if naive else "PunctStream"
            print(f"| {name} | {how} | {r.precision:.3f} | {r.recall:.3f} | {r.f1:.3f} | "
                  f"{errors} of {n_updates} |")
            if use_marks and not naive:
                stream_s = secs
    rec = score(puncts, [m.punct for m in rec_marks], puncts, puncts)[3]
    rec_errors = sum(rec_marks[e].punct in SENTENCE_END and puncts[e] not in SENTENCE_END
                     for e in _edge_indices(batches))
    print(f"| recogniser's own marks | - | {rec.precision:.3f} | {rec.recall:.3f} | "
          f"{rec.f1:.3f} | {rec_errors} of {len(batches)} |")

    print("\nspeed (1 core):" if args.threads == 1 else f"\nspeed ({args.threads} threads):")
    print(f"  batch tagging: {1000 * batch_s / n_words:.4f} ms/word")
    print(f"  streaming:     {1000 * stream_s / len(words):.4f} ms/word, "
          f"{1000 * stream_s / len(batches):.3f} ms/update")
    big = words[:10_000]
    t0 = time.perf_counter()
    tagger.tag(big, pauses[:10_000], right_context_complete=False)
    print(f"  10000 words in one call: {1000 * (time.perf_counter() - t0):.1f} ms")
    return 0


def _edge_indices(batches) -> list[int]:
    out, i = [], 0
    for b in batches:
        i += b.n_words
        out.append(i - 1)
    return out
