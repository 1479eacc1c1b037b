"""Subtitle layout: committed words -> cues (pop-on) and a live roll-up display.

Rules (configurable, defaults after broadcast guidelines): at most 2 lines of 42 characters
(32 for CEA-608 style), reading speed at most 17 characters/s where the speech allows, cue
duration 5/6 s to 7 s, a gap of at least 2 frames between cues, breaks at the tagger's
preferred places and never after an article or preposition (see :mod:`subd.layout.rules`).

Live constraint: a cue's words are final once committed, but its *end* is only known when the
next word arrives (or when the audio shows a pause), so a cue is emitted then. Committed text is
never rewritten; only the open cue grows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from subd.clock import parse_fps as parse_tick_fps
from subd.errors import ConfigError
from subd.layout.cjk import line_columns, max_cps, reading_chars
from subd.layout.rules import (
    SENTENCE_END,
    Token,
    break_score,
    line_len,
    line_text,
    split_long,
    takes_rest,
    wrap,
)
from subd.script import fullwidth_marks, has_cjk, joiner, latin_spaced
from subd.types import CaptionState, Cue, TaggedWord
from subd.validate import check_choice, check_range, from_mapping

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000


def parse_fps(section: str, text: str) -> Fraction:
    try:
        fps = parse_tick_fps(text)
    except ConfigError:
        msg = f"[{section}] fps = {text!r}: expected e.g. '25', '30', '30000/1001'"
        raise ConfigError(msg) from None
    check_range(section, "fps", float(fps), 1.0, 240.0)
    return fps


@dataclass(frozen=True, slots=True)
class LayoutConfig:
    max_lines: int = 2
    max_chars_per_line: int = 42  # 32 for CEA-608-style output
    max_cps: float = 17.0
    min_duration_ms: int = 834  # 5/6 s, rounded up
    max_duration_ms: int = 7000
    min_gap_frames: int = 2
    fps: str = "30"  # exact rational: "25", "30", "30000/1001"
    pause_break_ms: int = 1200  # a pause this long between two words starts a new cue
    flush_after_ms: int = 1500  # audio this long past the last word closes the open cue
    mode: str = "popon"  # live display: "popon" (whole cues) or "rollup" (words as committed)
    # cues in Chinese / Japanese (by their characters; subd.layout.cjk): characters per line
    # and reading speed after broadcasters' style guides for those languages
    cjk_max_chars_per_line: int = 16
    cjk_max_cps: float = 9.0
    ja_max_chars_per_line: int = 13
    ja_max_cps: float = 4.0
    section: str = "layout"

    def __post_init__(self) -> None:
        s = self.section
        check_range(s, "max_lines", self.max_lines, 1, 4)
        check_range(s, "max_chars_per_line", self.max_chars_per_line, 16, 80)
        check_range(s, "cjk_max_chars_per_line", self.cjk_max_chars_per_line, 8, 40)
        check_range(s, "ja_max_chars_per_line", self.ja_max_chars_per_line, 8, 40)
        check_range(s, "cjk_max_cps", self.cjk_max_cps, 2.0, 30.0)
        check_range(s, "ja_max_cps", self.ja_max_cps, 2.0, 30.0)
        check_range(s, "max_cps", self.max_cps, 5.0, 60.0)
        check_range(s, "min_duration_ms", self.min_duration_ms, 100, 5000)
        check_range(s, "max_duration_ms", self.max_duration_ms, self.min_duration_ms, 20000)
        check_range(s, "min_gap_frames", self.min_gap_frames, 0, 25)
        check_range(s, "pause_break_ms", self.pause_break_ms, 100, 10000)
        check_range(s, "flush_after_ms", self.flush_after_ms, 100, 30000)
        check_choice(s, "mode", self.mode, ("popon", "rollup"))
        parse_fps(s, self.fps)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], section: str = "layout") -> LayoutConfig:
        return from_mapping(cls, section, data, section=section)

    @property
    def frame_ns(self) -> int:
        return math.ceil(Fraction(NS_PER_S) / parse_fps(self.section, self.fps))

    @property
    def gap_ns(self) -> int:
        return self.min_gap_frames * self.frame_ns


CEA608 = LayoutConfig(max_chars_per_line=32)


@dataclass(frozen=True, slots=True)
class LayoutStats:
    n_cues: int = 0
    n_cps_violations: int = 0  # speech too fast for max_cps within the duration limits
    max_cps: float = 0.0
    n_gap_adjusted: int = 0  # start moved later to keep the minimum gap
    n_split_words: int = 0  # words longer than a line, hyphenated


@dataclass(frozen=True, slots=True)
class DisplayLine:
    """One line of a live display: committed text, then the tentative tail (styled apart)."""

    committed: str
    tentative: str = ""

    @property
    def text(self) -> str:
        return joiner(self.committed, self.tentative).join((self.committed, self.tentative)) \
            if self.committed and self.tentative else self.committed or self.tentative


def token_of(word: TaggedWord) -> Token:
    """``word`` as displayed; the rest of a word committed cut short (``Word.joined``) is glued
    to the word before it."""
    text = word.text.strip() or word.word.text.strip()
    joined = word.word.joined
    if word.case == "upper":
        text = text.upper()
    elif word.case == "cap" and text[:1].islower() and not joined:
        text = text[:1].upper() + text[1:]
    if word.punct and not text.endswith(word.punct):
        text += word.punct
    if has_cjk(text):
        text = latin_spaced(fullwidth_marks(text))  # "很好," -> "很好，", "况12" -> "况 12"
    return Token(text, word.word.start_ns, word.word.end_ns, word.punct, word.break_after,
                 glue_before=joined)


def cue_chars(lines: Iterable[str]) -> int:
    return sum(len(line) for line in lines)


class CueLayout:
    """Committed words -> pop-on cues, incrementally; the same input gives the same cues."""

    def __init__(self, config: LayoutConfig | None = None) -> None:
        self.config = config or LayoutConfig()
        c = self.config
        self._gap_ns = c.gap_ns
        self._frame_ns = c.frame_ns
        self._open: list[Token] = []
        self._last_end_ns: int | None = None
        self._next_index = 1
        self._stats = LayoutStats()
        # the open cue as last laid out, until words or a close change it: most ticks bring no
        # new word, and wrapping the open cue again 30 times a second per channel was an eighth
        # of the daemon's own CPU with 4 channels (py-spy, 2026-12-03)
        self._open_cue: Cue | None = None
        self._open_cue_fresh = False
        self._last_token: Token | None = None  # the last word of the last cue closed

    @property
    def stats(self) -> LayoutStats:
        return self._stats

    def _count(self, **deltas: float) -> None:
        s = self._stats
        self._stats = dataclasses.replace(
            s, **{k: getattr(s, k) + v for k, v in deltas.items()}
        )

    def push(
        self, words: Sequence[TaggedWord], audio_end_ns: int, tentative: str = ""
    ) -> list[Cue]:
        """Add newly committed words; return the cues closed by them (final, committed).

        The open cue is also closed when the audio has run ``flush_after_ms`` past its last
        word with nothing tentative (speech paused), or twice that long in any case.
        """
        out: list[Cue] = []
        if words:
            self._open_cue_fresh = False
        for word in words:
            tok = token_of(word)
            pieces = split_long(tok, line_columns(self.config, [tok]))
            if len(pieces) > 1:
                self._count(n_split_words=1)
            for tok in pieces:
                out.extend(self._add(tok))
        flush_ns = self.config.flush_after_ms * NS_PER_MS
        silent_ns = audio_end_ns - self._open[-1].end_ns if self._open else 0
        if self._open and silent_ns >= (flush_ns if not tentative.strip() else 2 * flush_ns):
            out.append(self._emit(self._open, None))
            self._open = []
            self._open_cue_fresh = False
        return out

    def finish(self) -> list[Cue]:
        """Close the open cue (end of stream)."""
        if not self._open:
            return []
        cue = self._emit(self._open, None)
        self._open = []
        self._open_cue_fresh = False
        return [cue]

    def open_cue(self) -> Cue | None:
        """The cue being built (committed words not yet in a closed cue), marked uncommitted."""
        if not self._open_cue_fresh:
            self._open_cue = self._lay_out_open()
            self._open_cue_fresh = True
        return self._open_cue

    def _lay_out_open(self) -> Cue | None:
        if not self._open:
            return None
        cols = line_columns(self.config, self._open)
        lines = wrap(self._open, cols, self.config.max_lines) or []
        return Cue(
            index=self._next_index,
            start_ns=self._open[0].start_ns,
            end_ns=self._open[-1].end_ns,
            lines=tuple(line_text(line) for line in lines),
            committed=False,
        )

    def apply(self, state: CaptionState) -> CaptionState:
        """``state`` with ``cues`` = the cues closed at this tick, then the open cue (if any)."""
        cues = self.push(state.committed, state.audio_end_ns, state.tentative)
        open_cue = self.open_cue()
        if open_cue is not None:
            cues.append(open_cue)
        return dataclasses.replace(state, cues=tuple(cues))

    # -- internals ---------------------------------------------------------------------

    def _fits(self, tokens: list[Token]) -> bool:
        c = self.config
        if tokens[-1].end_ns - tokens[0].start_ns > c.max_duration_ms * NS_PER_MS:
            return len(tokens) == 1
        return wrap(tokens, line_columns(c, tokens), c.max_lines, strict=True) is not None

    def _add(self, tok: Token) -> list[Cue]:
        c = self.config
        if not self._open:
            head = self._last_token
            if tok.glue_before and head is not None and takes_rest(head.text, tok.text):
                # the rest of a word whose head closed the last cue (a pause flushed it before
                # the rest came): the new cue shows the whole word, not "iable himself"
                tok = dataclasses.replace(tok, text=head.text + tok.text, glue_before=False)
            self._open = [tok]
            return []
        last = self._open[-1]
        out: list[Cue] = []
        if not tok.glue_before:
            pause = tok.start_ns - last.end_ns >= c.pause_break_ms * NS_PER_MS
            strong = (last.punct in SENTENCE_END or last.break_after >= 0.8) and (
                last.end_ns - self._open[0].start_ns >= c.min_duration_ms * NS_PER_MS
            )
            if pause or strong:
                out.append(self._emit(self._open, tok.start_ns))
                self._open = [tok]
                return out
        cand = self._open + [tok]
        while not self._fits(cand):
            j = self._best_split(cand)
            out.append(self._emit(cand[:j], cand[j].start_ns))
            cand = cand[j:]
        self._open = cand
        return out

    def _best_split(self, cand: list[Token]) -> int:
        c = self.config
        capacity = c.max_lines * line_columns(c, cand)
        min_dur_ns = c.min_duration_ms * NS_PER_MS
        best_j, best_score = len(cand) - 1, -math.inf
        lo, hi = 1, len(cand) - 1  # the longest head that fits (longer ones do not either)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self._fits(cand[:mid]) else (lo, mid - 1)
        if not self._fits(cand[:lo]):
            return best_j
        for j in range(1, lo + 1):
            head = cand[:j]
            score = break_score(cand[j - 1], cand[j]) + 2.0 * line_len(head) / capacity
            if head[-1].end_ns - head[0].start_ns < min_dur_ns:
                score -= 2.0
            if cand[j].glue_before:
                score -= 3.0  # a hyphenated word may wrap lines, but should not span cues
            if score > best_score:
                best_j, best_score = j, score
        return best_j

    def _emit(self, tokens: list[Token], next_start_ns: int | None) -> Cue:
        c = self.config
        start = tokens[0].start_ns
        if self._last_end_ns is not None and start < self._last_end_ns + self._gap_ns:
            start = self._last_end_ns + self._gap_ns
            self._count(n_gap_adjusted=1)
        lines = tuple(
            line_text(line)
            for line in (wrap(tokens, line_columns(c, tokens), c.max_lines) or [tokens])
        )
        n_chars = reading_chars(lines, tokens)
        cps_limit = max_cps(c, tokens)
        need_ns = max(c.min_duration_ms * NS_PER_MS, math.ceil(n_chars * NS_PER_S / cps_limit))
        end = max(tokens[-1].end_ns, start + need_ns)
        end = min(end, start + c.max_duration_ms * NS_PER_MS)
        if next_start_ns is not None:
            # Reading time gives way to the next cue, but the minimum duration does not: the
            # next cue then starts a little late (counted in n_gap_adjusted).
            end = min(end, next_start_ns - self._gap_ns)
        end = max(end, start + c.min_duration_ms * NS_PER_MS)
        duration_ns = end - start
        cps = n_chars * NS_PER_S / duration_ns
        self._count(
            n_cues=1,
            n_cps_violations=int(cps > cps_limit + 1e-9),
        )
        if cps > self._stats.max_cps:
            self._stats = dataclasses.replace(self._stats, max_cps=cps)
        self._last_end_ns = end
        self._last_token = tokens[-1]
        cue = Cue(index=self._next_index, start_ns=start, end_ns=end, lines=lines)
        self._next_index += 1
        return cue


class RollUp:
    """Live roll-up display: words appear as committed; the last ``max_lines`` lines show.

    Lines are filled greedily and never re-flowed once shown, except that a trailing article or
    preposition moves down with its noun.
    """

    def __init__(self, config: LayoutConfig | None = None) -> None:
        self.config = config or LayoutConfig(mode="rollup")
        self._lines: list[list[Token]] = [[]]

    def push(self, words: Sequence[TaggedWord]) -> None:
        for word in words:
            tok = token_of(word)
            for piece in split_long(tok, line_columns(self.config, [tok])):
                self._add(piece, self._lines)
        keep = self.config.max_lines + 1
        if len(self._lines) > keep:
            del self._lines[:-keep]

    def _add(self, tok: Token, lines: list[list[Token]]) -> None:
        cur = lines[-1]
        if line_len(cur + [tok]) <= line_columns(self.config, cur + [tok]):
            cur.append(tok)
            return
        carry: list[Token] = []
        while cur and len(carry) < 3 and self._glued(cur[-1], (carry or [tok])[0]):
            carry.insert(0, cur.pop())
        if not cur:  # nothing legal to keep: break where it falls
            cur.extend(carry)
            carry = []
        lines.append(carry + [tok])
        while line_len(lines[-1]) > line_columns(self.config, lines[-1]) and len(lines[-1]) > 1:
            lines.insert(len(lines) - 1, [lines[-1].pop(0)])

    @staticmethod
    def _glued(left: Token, right: Token) -> bool:
        return break_score(left, right) < -50

    def display(self, tentative: str = "") -> tuple[DisplayLine, ...]:
        """The lines to show now; the tentative tail is wrapped after the committed text."""
        lines = [list(line) for line in self._lines]
        for text in tentative.split():
            whole = Token(text, 0, 0)
            for tok in split_long(whole, line_columns(self.config, [whole])):
                self._add(dataclasses.replace(tok, tentative=True), lines)
        out = []
        for line in lines:
            if line:
                committed = [t for t in line if not t.tentative]
                out.append(DisplayLine(line_text(committed), line_text(line[len(committed) :])))
        return tuple(out[-self.config.max_lines :])
