"""[recognizer] encoder_pad_ms, encoder_bucket_ms and trim_after_ms: the cut span's window, as
the daemon hands it to each channel's streaming recogniser (subd.service.context)."""

from __future__ import annotations

import pytest

from subd.config import load_config
from subd.errors import ConfigError
from subd.history import AudioHistory
from subd.models.engine import EncoderSpan
from subd.service.context import ChannelContext


def _context(tmp_path, table: str) -> ChannelContext:
    path = tmp_path / "subd.toml"
    path.write_text("[recognizer]\nprocess = false\n" + table)
    return ChannelContext(load_config(path), *([None] * 10))


def test_the_window_keys_reach_each_channels_recogniser(tmp_path):
    ctx = _context(tmp_path, "encoder_bucket_ms = 1000\ntrim_after_ms = 3000\n")
    host = ctx.recogniser_host(AudioHistory(40 * 16_000)).build()
    rec = host.recognizer
    assert rec.span == EncoderSpan(2000, 1000)
    assert rec.config.trim_after_ms == 3000
    # 3.4 s of audio + 2 s of padding: 6 s encoded in 1 s buckets, 8 s in the default 4 s ones
    assert rec.span.frames(340) == 600 and EncoderSpan(2000, 4000).frames(340) == 800


def test_the_defaults_are_the_streaming_recognisers(tmp_path):
    rec = _context(tmp_path, "").recogniser_host(AudioHistory(40 * 16_000)).build().recognizer
    assert (rec.span, rec.config.trim_after_ms) == (EncoderSpan(2000, 4000), 15000)


@pytest.mark.parametrize(("key", "value"), [("trim_after_ms", 100), ("encoder_bucket_ms", 0)])
def test_a_window_key_out_of_range_is_a_config_error(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"recognizer.*{key}"):
        _context(tmp_path, f"{key} = {value}\n")
