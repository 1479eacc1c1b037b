"""Inference: ``PunctTagger.load()`` and ``tag(words, pauses_ms, right_context_complete)``,
optionally with the recogniser's own marks as evidence (``recogniser=``).

Long inputs are cut into bounded windows that overlap; each word takes its tag from the window
where it has at least ``_OVERLAP`` words of context on both sides, so cost is linear in the
number of words and a window edge never sits next to a decided word.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from subd.errors import ModelError

from .features import Featuriser, Vocabulary, evidence_ids, right_context, stack
from .model import N_TAGS, NetConfig, PunctNet, tag_index, tag_parts, viterbi
from .text import CASES, SENTENCE_END, RecogniserMark, normalise_word

PACKAGE_DIR = Path(__file__).resolve().parent
WEIGHTS_NAME = "weights.pt"
VOCAB_NAME = "vocab.txt"
MANIFEST_NAME = "manifest.json"
_CORE = 96  # words decided per window
_OVERLAP = 24  # context words on each side of the core


@dataclass(frozen=True, slots=True)
class WordTag:
    """The tagger's decision for one word: mark after it, case, break preference (0..1)."""

    punct: str
    case: str
    break_after: float


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class PunctTagger:
    def __init__(self, net: PunctNet, vocab: Vocabulary) -> None:
        self.net = net.eval()
        self.featuriser = Featuriser(vocab)
        self._start, self._trans, self._end = net.transitions()

    @classmethod
    def load(cls, directory: Path | str | None = None) -> PunctTagger:
        """Load weights + vocabulary from ``directory`` (default: the packaged model).

        The weights and vocabulary must match the SHA-256 digests in manifest.json.
        """
        root = Path(directory) if directory is not None else PACKAGE_DIR
        manifest_path = root / MANIFEST_NAME
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            for name in (WEIGHTS_NAME, VOCAB_NAME):
                want = manifest["sha256"][name]
                got = sha256_of(root / name)
                if got != want:
                    raise ModelError(
                        f"punctuation model {root / name}: SHA-256 {got[:12]}… does not match "
                        f"{want[:12]}… in {manifest_path} (re-run `subd train-punct`)"
                    )
            words = (root / VOCAB_NAME).read_text(encoding="utf-8").split("\n")
            vocab = Vocabulary(tuple(w for w in words if w))
            cfg = NetConfig(**manifest["net"])
            if cfg.n_ids != vocab.n_ids:
                raise ModelError(f"punctuation model {root}: vocabulary does not fit the weights")
            net = PunctNet(cfg)
            state = torch.load(root / WEIGHTS_NAME, map_location="cpu", weights_only=True)
            net.load_state_dict(state)
        except ModelError:
            raise
        except FileNotFoundError as exc:
            raise ModelError(f"punctuation model: missing file {exc.filename}") from None
        except (OSError, KeyError, TypeError, ValueError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"punctuation model {root}: cannot load ({first})") from None
        return cls(net, vocab)

    def tag(
        self,
        words: Sequence[str],
        pauses_ms: Sequence[float | None] | None = None,
        right_context_complete: bool = True,
        fixed: Sequence[tuple[str, str | None] | None] | None = None,
        stream_start: bool = True,
        recogniser: Sequence[RecogniserMark | None] | None = None,
    ) -> list[WordTag]:
        """Tag ``words``; ``pauses_ms[i]`` is the silence after word i (None = unknown).

        ``right_context_complete``: the last word ends the stream (nothing follows); if False,
        words near the end have little right context and the model knows it. ``fixed[i]``
        = (punct, case) pins word i (already committed) so the words after it stay consistent;
        (punct, None) pins only its mark, and the tagger chooses its case and the words after
        it to fit that mark.
        ``stream_start``: word 0 begins the stream (so it begins a sentence).
        ``recogniser[i]``: what the recogniser wrote for word i (``recogniser_mark``), weighed
        as evidence; None (or a None entry) = unknown, e.g. plain text.
        """
        norm = [normalise_word(w) or "<mark>" for w in words]
        n = len(norm)
        if pauses_ms is not None and len(pauses_ms) != n:
            raise ValueError(f"tag: {n} words but {len(pauses_ms)} pauses")
        if fixed is not None and len(fixed) != n:
            raise ValueError(f"tag: {n} words but {len(fixed)} fixed entries")
        if recogniser is not None and len(recogniser) != n:
            raise ValueError(f"tag: {n} words but {len(recogniser)} recogniser marks")
        if n == 0:
            return []
        rc = right_context(n, right_context_complete)
        evidence = evidence_ids(recogniser, n)
        spans = _windows(n)
        seqs = []
        for lo, hi, _, _ in spans:
            seqs.append(self.featuriser.encode(
                norm[lo:hi], None if pauses_ms is None else pauses_ms[lo:hi], rc[lo:hi],
                evidence[lo:hi]))
        arrays, mask = stack(seqs)
        with torch.inference_mode():
            x = {k: torch.from_numpy(v) for k, v in arrays.items()}
            emissions, brk = self.net(x)
        allowed = None
        if fixed is not None and any(f is not None for f in fixed):
            allowed = np.ones((len(spans), mask.shape[1], N_TAGS), dtype=bool)
            for b, (lo, hi, _, _) in enumerate(spans):
                for i in range(lo, hi):
                    if fixed[i] is not None:
                        punct, case = fixed[i]
                        allowed[b, i - lo] = False
                        for c in (CASES if case is None else (case,)):
                            allowed[b, i - lo, tag_index(punct, c)] = True
        paths = viterbi(emissions.numpy(), mask.sum(axis=1), self._start, self._trans,
                        self._end, allowed)
        probs = torch.sigmoid(brk).numpy()
        out: list[WordTag] = []
        for b, (lo, _, keep_lo, keep_hi) in enumerate(spans):
            for i in range(keep_lo, keep_hi):
                punct, case = tag_parts(paths[b][i - lo])
                out.append(WordTag(punct, case, round(float(probs[b, i - lo]), 3)))
        return _consistent(out, fixed, stream_start, right_context_complete)


def _windows(n: int) -> list[tuple[int, int, int, int]]:
    """(window lo, hi, keep lo, keep hi) covering 0..n with overlapping context."""
    spans = []
    for keep_lo in range(0, n, _CORE):
        keep_hi = min(n, keep_lo + _CORE)
        spans.append((max(0, keep_lo - _OVERLAP), min(n, keep_hi + _OVERLAP), keep_lo, keep_hi))
    return spans


def _consistent(
    tags: list[WordTag],
    fixed: Sequence[tuple[str, str | None] | None] | None,
    stream_start: bool,
    complete: bool,
) -> list[WordTag]:
    """A sentence (and the stream) starts with a capital and the stream ends with a mark,
    whatever the window said."""
    out = list(tags)
    last = len(out) - 1
    if out and complete and out[last].punct in ("", ",") and (fixed is None or fixed[last] is None):
        out[last] = WordTag(".", out[last].case, 1.0)
    for i in range(len(out)):
        if fixed is not None and fixed[i] is not None and fixed[i][1] is not None:
            continue
        starts = out[i - 1].punct in SENTENCE_END if i else stream_start
        if starts and out[i].case == "lower":
            out[i] = WordTag(out[i].punct, "cap", out[i].break_after)
    return out
