"""What the tick pipeline needs of the things around it, and its settings.

A :class:`Source` delivers audio chunks; a :class:`Worker` runs a stage (the recogniser, the
tagger) off the event loop and answers one request at a time; an :class:`Observer` hears each
hypothesis and each publication (metrics, health). :class:`TickSettings` are a channel's tick
parameters. Kept apart from the scheduler so that the service and the tests can name them
without reading the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

from subd.clock import Clock
from subd.types import DEFAULT_ENCODER_SPAN, CaptionState
from subd.workers.hosts import RecogniseResult

PREPARE_NS = 4_000_000  # the state is built at T(k) − 4 ms, then the publisher spins to T(k)


class Worker(Protocol):
    busy_since_ns: int | None

    async def call(self, request: Any, now_ns: int = 0) -> Any: ...


class Source(Protocol):
    live: bool  # has its own sample clock (drift is estimated)
    pullable: bool  # can be held back without losing audio

    async def start(self, clock: Clock) -> int: ...  # monotonic ns of sample 0

    def chunks(self) -> Any: ...  # async iterator of AudioChunk


class Observer(Protocol):
    def on_hypothesis(self, result: RecogniseResult, now_ns: int) -> None: ...

    def on_publish(self, state: CaptionState, sent_ns: int) -> None: ...


@dataclass(frozen=True, slots=True)
class TickSettings:
    fps: str = "30"
    latency_ms: int = 2000
    lookahead_ms: int = 150
    rate: Fraction = Fraction(1)  # audio seconds per wall second (file --speed)
    min_update_ms: int = 200
    encoder_span: str = DEFAULT_ENCODER_SPAN  # [recognizer] encoder_span (subd.pipeline.deadline)
    # [recognizer] update_cost_ms: 0 = measured; N: planned as N ms, sent on the audio's clock
    update_cost_ms: int = 0
    miss_tolerance_ms: float = 0.0  # 0: half a tick period
    drain_timeout_s: float = 30.0
    max_latency_ms: int = 0  # the slot ring is sized for this D (reloads up to it); 0: latency
    # the state is built and handed to sinks' prepare() this long before T(k) (at least
    # PREPARE_NS): a bus needs time to carry it to the edges before it is due
    prepare_ns: int = PREPARE_NS
