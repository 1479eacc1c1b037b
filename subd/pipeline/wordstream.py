"""The words of one stream: committed (append-only), decided by the tagger, and shown per tick.

Every committed word has a global index (its position in the committed stream). The publisher
advances ``published_idx`` only, so a word is published exactly once and in order, whichever
stage result arrives when; words are dropped from memory once published and no longer needed.
"""

from __future__ import annotations

import collections

from subd.types import CaptionState, Hypothesis, TaggedWord, Word
from subd.workers.hosts import TagRequest, TagResult, passthrough


class WordStream:
    def __init__(self) -> None:
        self._committed: collections.deque[Word] = collections.deque()
        self._committed_base = 0
        self.n_committed = 0
        self._final: collections.deque[TaggedWord] = collections.deque()
        self._final_base = 0
        self._provisional: tuple[TaggedWord, ...] = ()
        self.tentative: tuple[Word, ...] = ()
        self.published_idx = -1
        self.published_end_ns = -1  # end of the last published word
        self.hyp_seq = 0  # hypotheses integrated
        self._tag_seq = 0  # hypotheses the tagger has seen
        self.tag_fed = 0  # committed words sent to the tagger
        self.tag_flushed = False

    @property
    def n_final(self) -> int:
        return self._final_base + len(self._final)

    @property
    def n_unpublished(self) -> int:
        return self.n_committed - (self.published_idx + 1)

    def add_hypothesis(self, hyp: Hypothesis) -> None:
        self._committed.extend(hyp.committed)
        self.n_committed += len(hyp.committed)
        self.tentative = tuple(hyp.tentative)
        self.hyp_seq += 1

    def tagger_is_current(self) -> bool:
        return self.hyp_seq == self._tag_seq

    def undecided_until(self, cutoff_ns: int) -> bool:
        """Whether a committed word ending by ``cutoff_ns`` still waits for its punctuation."""
        # words published undecided (degraded ticks: a tag stage that overran or was being
        # respawned) are gone from memory and need no decision any more
        idx = max(self.n_final, self._committed_base)
        return idx < self.tag_fed and \
            self._committed[idx - self._committed_base].end_ns <= cutoff_ns

    def tag_request(self, k: int, audio_end_ns: int, flush: bool,
                    decide_until_ns: int | None = None) -> TagRequest:
        """What the tagger has not seen yet; from now on it counts as seen. Words ending by
        ``decide_until_ns`` (tick k's audio end) must be decided by this pass."""
        start = self.tag_fed - self._committed_base
        words = tuple(self._committed)[start:]
        req = TagRequest(k=k, first_idx=self.tag_fed, committed=words,
                         tentative=self.tentative, audio_end_ns=audio_end_ns, flush=flush,
                         decide_until_ns=decide_until_ns)
        self.tag_fed = self.n_committed
        self._tag_seq = self.hyp_seq
        self.tag_flushed = self.tag_flushed or flush
        return req

    def add_tagged(self, result: TagResult) -> None:
        if result.first_final_idx != self.n_final:
            raise RuntimeError(f"tagger returned final word {result.first_final_idx}, "
                               f"expected {self.n_final}")
        self._final.extend(result.final)
        self._provisional = result.provisional

    def state(self, k: int, due_ns: int, cutoff_ns: int, degraded: bool) -> CaptionState:
        """Tick k: decided words heard by ``cutoff_ns`` not yet published (on the cheap path
        also undecided committed words), and the rest heard by then as tentative text."""
        committed: list[TaggedWord] = []
        idx = self.published_idx + 1
        n_final = self.n_final
        while idx < n_final:
            tw = self._final[idx - self._final_base]
            if tw.word.end_ns > cutoff_ns:
                break
            committed.append(tw)
            idx += 1
        if degraded and idx >= n_final:
            while idx < self.n_committed:
                w = self._committed[idx - self._committed_base]
                if w.end_ns > cutoff_ns:
                    break
                committed.append(passthrough(w, False))
                idx += 1
        # what is already on screen as committed never shows again as tentative
        last_end = committed[-1].word.end_ns if committed else self.published_end_ns
        shown: list[str] = []
        for i in range(max(idx, self._final_base), n_final):
            tw = self._final[i - self._final_base]
            if tw.word.start_ns < cutoff_ns:
                shown.append(tw.text + tw.punct)
        for tw in self._provisional:
            if tw.word.start_ns < cutoff_ns and tw.word.end_ns > last_end:
                shown.append(tw.text + tw.punct)
        return CaptionState(k=k, due_ns=due_ns, audio_end_ns=cutoff_ns,
                            committed=tuple(committed), tentative=" ".join(shown),
                            degraded=degraded)

    def mark_published(self, state: CaptionState) -> None:
        self.published_idx += len(state.committed)
        if state.committed:
            self.published_end_ns = state.committed[-1].word.end_ns
        keep = min(self.published_idx + 1, self.tag_fed)
        while self._committed_base < keep and self._committed:
            self._committed.popleft()
            self._committed_base += 1
        while self._final_base <= self.published_idx and self._final:
            self._final.popleft()
            self._final_base += 1
