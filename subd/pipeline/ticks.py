"""Exact tick arithmetic: T(k) = t0 + (k+1)·P + D in integer nanoseconds, never accumulated.

The tick period P = 1/fps is an exact rational (fps "30", "25", "30000/1001"). Every due time is
computed from an anchor with one exact floor division, so 30000/1001 stays exact over hours.
Audio boundaries of ticks are on the audio timeline and never depend on wall time; the wall
mapping may run at a rate other than 1 (``--speed`` for files, estimated drift for live cards),
which :meth:`TickGrid.rebase` changes without moving any tick that was already scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from subd.clock import parse_fps  # noqa: F401 - named here by the commands and tests
from subd.errors import ConfigError
from subd.types import SAMPLE_RATE_HZ

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000


def fps_text(fps: Fraction) -> str:
    """The events-log spelling: "30/1", "30000/1001"."""
    return f"{fps.numerator}/{fps.denominator}"


def parse_rate(value: str | int | float | Fraction) -> Fraction:
    """Parse a positive playback speed ("1", "2.5", "3/2") exactly."""
    try:
        rate = Fraction(str(value).strip()) if not isinstance(value, Fraction) else value
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"speed: {value!r} is not a number") from None
    if not (Fraction(1, 100) <= rate <= 1000):
        raise ConfigError(f"speed: {value!r} is out of range (0.01..1000)")
    return rate


@dataclass(frozen=True, slots=True)
class TickGrid:
    """The tick schedule of one stream.

    ``rate`` is audio seconds per wall second (speed × sample-clock drift). Due times:
    ``due_ns(k) = anchor_due_ns + floor((k − anchor_k)·P / rate)``, with the initial anchor
    ``(−1, t0_ns + latency_ns)`` so that at rate 1 ``due_ns(k) = t0 + (k+1)·P + D`` exactly.
    """

    fps: Fraction
    t0_ns: int
    latency_ns: int
    lookahead_ns: int
    rate: Fraction = Fraction(1)
    anchor_k: int = -1
    anchor_due_ns: int | None = None

    @classmethod
    def create(
        cls,
        fps: str | int | Fraction,
        t0_ns: int,
        latency_ms: int,
        lookahead_ms: int,
        rate: Fraction | int = 1,
    ) -> TickGrid:
        return cls(
            fps=parse_fps(fps),
            t0_ns=int(t0_ns),
            latency_ns=int(latency_ms) * NS_PER_MS,
            lookahead_ns=int(lookahead_ms) * NS_PER_MS,
            rate=Fraction(rate),
            anchor_due_ns=int(t0_ns) + int(latency_ms) * NS_PER_MS,
        )

    @property
    def period_ns(self) -> Fraction:
        """Exact audio-timeline tick period in ns."""
        return NS_PER_S / self.fps

    @property
    def wall_period_ns(self) -> Fraction:
        return self.period_ns / self.rate

    def due_ns(self, k: int) -> int:
        """Monotonic publication deadline of tick k (floor of the exact rational)."""
        anchor = self.t0_ns + self.latency_ns if self.anchor_due_ns is None else self.anchor_due_ns
        num = (k - self.anchor_k) * NS_PER_S * self.fps.denominator * self.rate.denominator
        den = self.fps.numerator * self.rate.numerator
        return anchor + num // den

    def fetch_ns(self, k: int) -> int:
        """Look-ahead fetch time of tick k: T(k) − A."""
        return self.due_ns(k) - self.lookahead_ns

    def audio_end_ns(self, k: int) -> int:
        """End of tick k's audio on the audio timeline (ns since sample 0)."""
        return (k + 1) * NS_PER_S * self.fps.denominator // self.fps.numerator

    def audio_end_sample(self, k: int) -> int:
        """First sample *after* tick k (tick k holds [end_sample(k−1), end_sample(k)))."""
        return (k + 1) * SAMPLE_RATE_HZ * self.fps.denominator // self.fps.numerator

    def tick_of_sample(self, sample: int) -> int:
        """The tick whose audio holds ``sample`` (sample ≥ 0)."""
        k = sample * self.fps.numerator // (SAMPLE_RATE_HZ * self.fps.denominator)
        while self.audio_end_sample(k) <= sample:
            k += 1
        while k > 0 and self.audio_end_sample(k - 1) > sample:
            k -= 1
        return k

    def first_due_at_or_after(self, t_ns: int) -> int:
        """Smallest k ≥ 0 whose due time is ≥ t_ns."""
        if self.due_ns(0) >= t_ns:
            return 0
        wall = self.wall_period_ns
        k = max(0, int((t_ns - self.due_ns(0)) / wall))
        while self.due_ns(k) < t_ns:
            k += 1
        while k > 0 and self.due_ns(k - 1) >= t_ns:
            k -= 1
        return k

    def rebase(self, k: int, rate: Fraction, offset_ns: int = 0) -> TickGrid:
        """A grid at a new rate whose tick k is due at this grid's due_ns(k) + offset_ns.

        Ticks before k keep their times, so a scheduler can switch grids between the fetch
        of tick k−1 and tick k without moving anything already scheduled.
        """
        return replace(
            self, rate=Fraction(rate), anchor_k=k, anchor_due_ns=self.due_ns(k) + offset_ns
        )
