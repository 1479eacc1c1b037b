"""``subd bench livefile`` at a small N: it times both marks and leaves one valid SRT."""

from __future__ import annotations

from pathlib import Path

import pysrt

from subd.bench.livefile import WINDOW, bench


def test_bench_times_both_marks_on_one_valid_file(tmp_path: Path) -> None:
    r = bench(tmp_path, 1000, fill_fsync=False)
    assert len(r["early"]) == len(r["late"]) == WINDOW
    subs = pysrt.open(str(tmp_path / "live.srt"), error_handling=pysrt.ERROR_RAISE)
    assert [s.index for s in subs] == list(range(1, len(subs) + 1))
    assert len(subs) == 1000 + WINDOW // 2 - 1
    assert subs[-1].text.startswith(f"cue number {len(subs)} ")
