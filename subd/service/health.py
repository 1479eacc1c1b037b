"""``/healthz``: is the daemon doing its job? Ticks advancing, lag within bound, model loaded.

The daemon reports facts as they happen (:meth:`HealthMonitor.tick`, ``set_lag``,
``set_source``, ``set_state``, ``set_model_loaded``); a request evaluates them against the
injected clock and answers JSON with 200 or 503.

Whole-daemon status:
- ``fail`` (503): the model is not loaded, there is no channel, or some channel is stalled
  (no tick for ``stall_after_ns``), lags beyond ``max_lag_ns`` or was given up on (failed).
  Restarting the daemon may help, so a supervisor should act on it.
- ``degraded`` (200): every channel ticks, but some source is down (file vanished, device
  unplugged, pusher gone) or a stage process is being respawned (it died or hung). The clock
  keeps publishing; a restart would not help.
- ``ok`` (200).

A per-channel view (``/c/NAME/healthz``) answers 503 as soon as that channel is not delivering
captions, its source being down included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from subd.server.ops import health_handler  # noqa: F401 - re-exported (callers, tests)

NS_PER_MS = 1_000_000

RUNNING = "running"
STANDBY = "standby"  # another daemon holds the channel's lease (subd.bus): nothing to publish
RESTARTING = "restarting"
FAILED = "failed"
STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class HealthLimits:
    stall_after_ns: int = 2_000_000_000  # longest gap between two ticks still considered alive
    max_lag_ns: int = 10_000_000_000  # pipeline audio end may trail the tick by this much


@dataclass(frozen=True, slots=True)
class ChannelHealth:
    name: str
    state: str
    ok: bool  # ticks advancing, lag within bound, not failed
    source_up: bool | None  # None: not reported yet
    last_tick_k: int | None
    since_last_tick_ms: float | None
    lag_ms: float | None
    problems: tuple[str, ...] = ()
    source_detail: str = ""
    state_detail: str = ""

    @property
    def serving(self) -> bool:
        """The channel delivers captions from live audio right now."""
        return self.ok and self.source_up is not False

    def to_json(self) -> dict:
        return {
            "state": self.state,
            "ok": self.ok,
            "source": {None: "unknown", True: "up", False: "down"}[self.source_up],
            "source_detail": self.source_detail,
            "state_detail": self.state_detail,
            "last_tick": self.last_tick_k,
            "since_last_tick_ms": _round(self.since_last_tick_ms),
            "lag_ms": _round(self.lag_ms),
            "problems": list(self.problems),
        }


@dataclass(frozen=True, slots=True)
class HealthReport:
    status: str  # "ok" | "degraded" | "fail"
    model_loaded: bool
    channels: dict[str, ChannelHealth] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    stages: dict[str, dict] = field(default_factory=dict)

    @property
    def http_status(self) -> int:
        return 503 if self.status == "fail" else 200

    def to_json(self) -> dict:
        return {
            "status": self.status,
            "model_loaded": self.model_loaded,
            "problems": list(self.problems),
            "stages": self.stages,
            "channels": {name: ch.to_json() for name, ch in self.channels.items()},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class _ChannelFacts:
    __slots__ = (
        "added_ns", "first_tick_ns", "last_tick_k", "last_tick_ns", "lag_ns", "source_up",
        "source_detail", "state", "state_detail",
    )

    def __init__(self, added_ns: int, first_tick_ns: int = 0) -> None:
        self.added_ns = added_ns
        self.first_tick_ns = first_tick_ns  # D: a channel's first tick is due D after its audio
        self.last_tick_k: int | None = None
        self.last_tick_ns: int | None = None
        self.lag_ns: int | None = None
        self.source_up: bool | None = None
        self.source_detail = ""
        self.state = RUNNING
        self.state_detail = ""


class HealthMonitor:
    def __init__(
        self,
        limits: HealthLimits | None = None,
        now_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.limits = limits or HealthLimits()
        self._now_ns = now_ns
        self._channels: dict[str, _ChannelFacts] = {}
        self._model_loaded = False
        self._stages: dict[str, tuple] = {}  # stage -> (state, detail, pid, restarts)

    # -- facts, reported by the daemon -------------------------------------------------------

    def set_model_loaded(self, loaded: bool = True) -> None:
        self._model_loaded = loaded

    def set_stage(self, name: str, state: str, detail: str = "", pid: int | None = None,
                  restarts: int = 0) -> None:
        """A stage process's supervision state: "up", or "restarting" (dead or hung, being
        respawned: ticks keep publishing, captions pause)."""
        self._stages[name] = (state, detail, pid, restarts)

    def stages(self) -> dict[str, dict]:
        return {n: {"state": st, "detail": d, "pid": pid, "restarts": r}
                for n, (st, d, pid, r) in self._stages.items()}

    def add_channel(self, name: str, latency_ns: int = 0) -> None:
        """``latency_ns``: the channel's D. Its first tick is published D after its first audio,
        so "no tick since start" waits ``stall_after_ns`` past that (with D = 4 s the daemon said
        "fail" for the first 2 s of every channel, and for a moment with D = 2 s)."""
        if name not in self._channels:
            self._channels[name] = _ChannelFacts(self._now_ns(), latency_ns)

    def set_latency(self, name: str, latency_ns: int) -> None:
        """A reload changed the channel's D in place (it was not restarted): a first tick not
        published yet is now due the new D after the audio, so the start-up grace follows it
        (with the old D kept, 0.5 s -> 30 s said "fail" 2.5 s after the start)."""
        self._facts(name).first_tick_ns = latency_ns

    def remove_channel(self, name: str) -> None:
        self._channels.pop(name, None)

    def _facts(self, name: str) -> _ChannelFacts:
        facts = self._channels.get(name)
        if facts is None:
            self.add_channel(name)
            facts = self._channels[name]
        return facts

    def tick(self, name: str, k: int, now_ns: int | None = None) -> None:
        facts = self._facts(name)
        facts.last_tick_k = k
        facts.last_tick_ns = self._now_ns() if now_ns is None else now_ns

    def set_lag(self, name: str, lag_ns: int) -> None:
        self._facts(name).lag_ns = lag_ns

    def set_source(self, name: str, up: bool, detail: str = "") -> None:
        facts = self._facts(name)
        facts.source_up = up
        facts.source_detail = detail

    def set_state(self, name: str, state: str, detail: str = "") -> None:
        """Supervisor state: running, restarting, failed or stopped; or standby (subd.bus)."""
        facts = self._facts(name)
        if facts.state != RUNNING and state == RUNNING:
            facts.added_ns = self._now_ns()  # a restarted channel gets a fresh start-up grace
        facts.state = state
        facts.state_detail = detail

    # -- evaluation ---------------------------------------------------------------------------

    def channel(self, name: str, now_ns: int | None = None) -> ChannelHealth | None:
        facts = self._channels.get(name)
        if facts is None:
            return None
        return self._evaluate(name, facts, self._now_ns() if now_ns is None else now_ns)

    def _evaluate(self, name: str, facts: _ChannelFacts, now_ns: int) -> ChannelHealth:
        problems: list[str] = []
        since_ms = None
        if facts.state == FAILED:
            problems.append(f"channel failed: {facts.state_detail or 'gave up restarting'}")
        elif facts.state == STOPPED:
            problems.append("channel stopped")
        if facts.state == STANDBY:
            pass  # its clock runs on the daemon holding the lease
        elif facts.last_tick_ns is None:
            if now_ns - facts.added_ns > self.limits.stall_after_ns + facts.first_tick_ns:
                problems.append("no tick published since start")
        else:
            gap_ns = now_ns - facts.last_tick_ns
            since_ms = gap_ns / NS_PER_MS
            if gap_ns > self.limits.stall_after_ns:
                problems.append(
                    f"ticks stalled: last tick {since_ms:.0f} ms ago "
                    f"(bound {self.limits.stall_after_ns / NS_PER_MS:.0f} ms)"
                )
        respawning = any(st[0] != "up" for st in self._stages.values())
        if facts.lag_ns is not None and facts.lag_ns > self.limits.max_lag_ns and not respawning:
            # (while a stage process is respawned the lag grows by design: reported as that)
            problems.append(
                f"lag {facts.lag_ns / NS_PER_MS:.0f} ms over bound "
                f"{self.limits.max_lag_ns / NS_PER_MS:.0f} ms"
            )
        return ChannelHealth(
            name=name,
            state=facts.state,
            ok=not problems,
            source_up=facts.source_up,
            last_tick_k=facts.last_tick_k,
            since_last_tick_ms=since_ms,
            lag_ms=None if facts.lag_ns is None else facts.lag_ns / NS_PER_MS,
            problems=tuple(problems),
            source_detail=facts.source_detail,
            state_detail=facts.state_detail,
        )

    def report(self, now_ns: int | None = None) -> HealthReport:
        now = self._now_ns() if now_ns is None else now_ns
        channels = {name: self._evaluate(name, f, now) for name, f in self._channels.items()}
        problems: list[str] = []
        if not self._model_loaded:
            problems.append("model not loaded")
        if not channels:
            problems.append("no channel configured")
        for ch in channels.values():
            problems.extend(f"{ch.name}: {p}" for p in ch.problems)
        stages_down = [f"{name} stage restarting: {detail}"
                       for name, (state, detail, *_) in self._stages.items() if state != "up"]
        if problems:
            status = "fail"
        elif stages_down or any(ch.source_up is False for ch in channels.values()):
            status = "degraded"
            problems = stages_down + [
                f"{ch.name}: source down" + (f" ({ch.source_detail})" if ch.source_detail else "")
                for ch in channels.values()
                if ch.source_up is False
            ]
        else:
            status = "ok"
        return HealthReport(status, self._model_loaded, channels, tuple(problems),
                            self.stages())
