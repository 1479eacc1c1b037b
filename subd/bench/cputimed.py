"""Stage hosts on a fake clock: each call lasts its CPU time, or a modelled cost (``subd bench
quality --pace cpu --update-ms FULL,CUT``, ``subd bench serial``): the decisions of a device of
known speed, the same however loaded this machine is."""

from __future__ import annotations

import time

from subd.types import UpdateCosts

# --update-ms: an update without new audio decodes nothing (it hands out the due words of the
# last reading); it lasts this long, not its CPU time, which moved with the machine's load and
# with it the start of the next update (a re-run of the same command read a word differently)
NO_DECODE_NS = 1_000_000


class CpuTimed:
    """A stage host whose calls last, on the fake clock, their CPU time; with ``update_ns`` an
    update lasts its span's cost (full input, cut span) and a stream's end the full input's (at
    its CPU time load moved a stream's last words), an update without new audio
    ``NO_DECODE_NS``; ``fixed_ns``: every call (bench serial's)."""

    def __init__(self, host, update_ns: tuple[int, int] | None = None,
                 fixed_ns: int | None = None) -> None:
        self.host = host
        self.update_ns = update_ns
        self.fixed_ns = fixed_ns
        self.last_ns = 0
        self.costs_ns: list[int] = []
        self.kinds: list[bool | None] = []  # each call's full_span (None: not an update)
        self._ends: dict[str, int] = {}  # each channel's last request's end sample

    @property
    def update_costs(self) -> UpdateCosts | None:
        """The recogniser's update costs as measured before the first words
        (subd.recognise.warmup): with ``update_ns``, the modelled ones (what a device of that
        speed measures), else its host's."""
        return self._modelled(getattr(self.host, "update_costs", None))

    def _modelled(self, measured):
        if self.update_ns is None or not isinstance(measured, UpdateCosts):
            return measured
        return UpdateCosts(full_ns=self.update_ns[0], cut_ns=self.update_ns[1])

    def handle(self, request):
        t_ns = time.thread_time_ns()
        self.kinds.append(getattr(request, "full_span", None))
        try:
            return self._modelled(self.host.handle(request))  # an attach's: its measurement
        finally:
            self.last_ns = self.cost_ns(request, time.thread_time_ns() - t_ns)
            self.costs_ns.append(self.last_ns)

    def cost_ns(self, request, cpu_ns: int, channel: str = "") -> int:
        from subd.workers.hosts import FinishRequest, UpdateRequest
        if self.update_ns is not None and isinstance(request, UpdateRequest | FinishRequest):
            last = self._ends.get(channel, -1)
            self._ends[channel] = request.end_sample
            if isinstance(request, UpdateRequest) and request.end_sample <= last:
                return NO_DECODE_NS  # no new audio, no decode (the due words before the end)
            return self.update_ns[0 if getattr(request, "full_span", True) else 1]
        return cpu_ns if self.fixed_ns is None else self.fixed_ns
