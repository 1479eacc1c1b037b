"""When to try a failed source again: capped exponential backoff, forever.

A microphone that was unplugged is reopened at 1 s, 2 s, 4 s ... then every 30 s until it is
back; the first try after it comes back resets the delay. (A channel whose source cannot even
start is restarted by the channel supervisor with the same kind of backoff.)
"""

from __future__ import annotations

NS_PER_S = 1_000_000_000


class RetryBackoff:
    def __init__(self, first_s: float = 1.0, max_s: float = 30.0) -> None:
        self.first_ns = int(first_s * NS_PER_S)
        self.max_ns = int(max_s * NS_PER_S)
        self.delay_ns = 0  # 0: no failure since the last reset
        self.next_ns = 0
        self.attempts = 0

    def due(self, now_ns: int) -> bool:
        """Whether a try is due now."""
        return now_ns >= self.next_ns

    def failed(self, now_ns: int) -> int:
        """A try failed (or has not helped yet) at ``now_ns``: the delay before the next one."""
        self.attempts += 1
        self.delay_ns = min(self.delay_ns * 2, self.max_ns) if self.delay_ns else self.first_ns
        self.next_ns = now_ns + self.delay_ns
        return self.delay_ns

    def reset(self) -> None:
        self.delay_ns = self.next_ns = 0
