"""A deterministic scripted recogniser: the scheduler's test double (never used by the CLI).

It "hears" a fixed script of timed words: a word becomes tentative once its audio has been
accepted and is committed ``commit_delay_ms`` later, like a local-agreement policy. The
tentative tail deliberately changes spelling between updates, so tests can tell that only the
tail may change while committed words never do. A prompt (``set_prompt``, what a channel's
requests carry) is written into the words heard after it: with "Tilney" set, "w7" is "Tilney7",
so a test can tell which prompt reached the recogniser, and when.
"""

from __future__ import annotations

from subd.types import AudioChunk, Hypothesis, Word, samples_to_ns

NS_PER_MS = 1_000_000


def script_words(n_words: int, word_ms: int = 300, gap_ms: int = 100,
                 start_ms: int = 200) -> list[tuple[str, int, int]]:
    """``n_words`` words "w0".."wN" of ``word_ms`` separated by ``gap_ms``: (text, ms, ms)."""
    out = []
    t = start_ms
    for i in range(n_words):
        out.append((f"w{i}", t, t + word_ms))
        t += word_ms + gap_ms
    return out


class ScriptedRecognizer:
    def __init__(self, words: list[tuple[str, int, int]] | None = None, n_words: int = 50,
                 commit_delay_ms: int = 600, word_ms: int = 300, gap_ms: int = 100) -> None:
        script = words if words is not None else script_words(n_words, word_ms, gap_ms)
        self.words = [Word(text, s * NS_PER_MS, e * NS_PER_MS) for text, s, e in script]
        self._texts = [w.text for w in self.words]  # as scripted (set_prompt writes others)
        self.commit_delay_ns = commit_delay_ms * NS_PER_MS
        self.audio_end_ns = 0
        self.n_committed = 0
        self.n_updates = 0
        self.prompt = ""

    def set_prompt(self, text: str) -> None:
        self.prompt = text
        head = text.split()[0].strip(".,") if text.split() else ""
        for i in range(self.n_committed, len(self.words)):  # the words not yet committed
            w = self.words[i]
            self.words[i] = Word(f"{head}{i}" if head else self._texts[i], w.start_ns, w.end_ns)

    def accept(self, chunk: AudioChunk) -> None:
        self.audio_end_ns = max(self.audio_end_ns, samples_to_ns(chunk.start_sample
                                                                 + chunk.n_samples))

    def _commit_until(self, limit_ns: int) -> tuple[Word, ...]:
        start = self.n_committed
        while self.n_committed < len(self.words) and \
                self.words[self.n_committed].end_ns <= limit_ns:
            self.n_committed += 1
        return tuple(self.words[start:self.n_committed])

    def _tentative(self) -> tuple[Word, ...]:
        tail = [w for w in self.words[self.n_committed:] if w.end_ns <= self.audio_end_ns]
        if tail and self.n_updates % 2:  # an unsure guess that flickers between updates
            last = tail[-1]
            tail[-1] = Word(last.text + "?", last.start_ns, last.end_ns, 0.5)
        return tuple(tail)

    def update(self) -> Hypothesis:
        self.n_updates += 1
        committed = self._commit_until(self.audio_end_ns - self.commit_delay_ns)
        return Hypothesis(committed, self._tentative(), self.audio_end_ns)

    def finish(self) -> Hypothesis:
        committed = self._commit_until(self.audio_end_ns)
        return Hypothesis(committed, (), self.audio_end_ns)
