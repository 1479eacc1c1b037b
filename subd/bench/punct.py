"""``subd bench punct``: held-out precision/recall/F1 and ms per word of the punctuation tagger.

Held-out documents come from the same offline packages as training (split by document, see
models/punct/corpus.py); pauses are simulated from the true marks under a fixed seed. The
streaming part feeds held-out text through PunctStream in random commit steps with a tentative
tail and counts sentence ends at commit edges that the text does not have.
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


def _timed_words(words: list[str], pauses_ms: list[float]) -> list[Word]:
    out = []
    t_ns = 0
    rng = random.Random(7)
    for w, pause in zip(words, pauses_ms, strict=True):
        dur_ns = int((120 + 45 * len(w) + rng.uniform(-40, 40)) * NS_PER_MS)
        out.append(Word(w, t_ns, t_ns + dur_ns))
        t_ns += dur_ns + int(pause * NS_PER_MS)
    return out


def _stream(
    tagger, words: list[Word], truth: list[str], naive: bool = False
) -> tuple[list[str], int, int, float]:
    """Feed ``words`` in random commit steps; returns final marks, edge errors, updates, s.

    ``naive``: instead of PunctStream, decide each update's committed words at once with the
    right context there is (the tentative tail), as a recogniser does at its window edges:
    the baseline that waiting for right context replaces.
    """
    from subd.models.punct import SENTENCE_END, tag_words
    from subd.punct_stream import PunctStream

    stream = PunctStream(tagger)
    rng = random.Random(11)
    marks: list[str] = []
    edges: list[int] = []
    i = 0
    n_updates = 0
    t0 = time.perf_counter()
    while i < len(words):
        step = rng.randint(1, 4)
        committed = words[i : i + step]
        tentative = words[i + step : i + step + rng.randint(0, 4)]
        i += len(committed)
        edges.append(i - 1)
        audio_end = (tentative[-1] if tentative else committed[-1]).end_ns + 150 * NS_PER_MS
        if naive:
            chunk = [*words[max(0, i - 24) : i], *tentative]
            tags = tag_words(tagger, chunk, right_context_complete=False, after_last_ns=audio_end)
            marks += [t.punct for t in tags[len(chunk) - len(tentative) - len(committed) :][
                : len(committed)]]
        else:
            marks += [t.punct for t in stream.update(committed, tentative, audio_end).final]
        n_updates += 1
    if not naive:
        marks += [t.punct for t in stream.flush().final]
    seconds = time.perf_counter() - t0
    edge_errors = sum(marks[e] in SENTENCE_END and truth[e] not in SENTENCE_END for e in edges)
    return marks, edge_errors, n_updates, seconds


def run(args: argparse.Namespace) -> int:
    import torch

    from subd.models.punct import PunctTagger
    from subd.models.punct.evaluate import EVAL_SEED, evaluate_docs, score
    from subd.models.punct.simulate import eval_stream
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
    print("\nwith simulated pauses, whole documents (right context complete):")
    print("| class | precision | recall | F1 | n true |\n|---|---|---|---|---|")
    for r in rows:
        print(r.row())
    rows_text, _ = evaluate_docs(tagger, docs, with_pauses=False)
    print("\ntext only (no pauses):")
    print("| class | precision | recall | F1 | n true |\n|---|---|---|---|---|")
    for r in rows_text:
        print(r.row())

    # Streaming: the committer over a bounded sample of held-out text.
    words: list[str] = []
    pauses: list[float] = []
    puncts: list[str] = []
    cases: list[str] = []
    for i, doc in enumerate(docs):
        w, p, pu, ca = eval_stream(doc, EVAL_SEED + i)
        take = max(200, args.max_words // len(docs))
        words += w[:take]
        pauses += p[:take]
        puncts += pu[:take]
        cases += ca[:take]
    timed = _timed_words(words, pauses)
    final_marks, edge_errors, n_updates, stream_s = _stream(tagger, timed, puncts)
    stream_rows = score(puncts, final_marks, cases, cases)  # case is scored in the batch run
    print(f"\nstreaming ({len(words)} words, {n_updates} updates of 1-4 committed words + "
          "0-4 tentative):")
    print("| class | precision | recall | F1 | n true |\n|---|---|---|---|---|")
    for r in stream_rows[:4]:
        print(r.row())
    naive_marks, naive_errors, _, _ = _stream(tagger, timed, puncts, naive=True)
    naive_rows = score(puncts, naive_marks, cases, cases)
    print(f"| baseline: decided at once, no waiting, sentence end | "
          f"{naive_rows[3].precision:.3f} | {naive_rows[3].recall:.3f} | {naive_rows[3].f1:.3f} "
          f"| {naive_rows[3].n_true} |")
    print(f"sentence ends put at a commit edge where the text has none: {edge_errors} "
          f"(baseline: {naive_errors}) of {n_updates} edges")

    print("\nspeed (1 core):" if args.threads == 1 else f"\nspeed ({args.threads} threads):")
    print(f"  batch tagging: {1000 * batch_s / n_words:.4f} ms/word")
    print(f"  streaming:     {1000 * stream_s / len(words):.4f} ms/word, "
          f"{1000 * stream_s / n_updates:.3f} ms/update")
    big = words[:10_000]
    t0 = time.perf_counter()
    tagger.tag(big, pauses[:10_000], right_context_complete=False)
    print(f"  10000 words in one call: {1000 * (time.perf_counter() - t0):.1f} ms")
    return 0
