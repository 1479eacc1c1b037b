"""Chinese captions in one script (``[recognizer] chinese_script``), and a committed character
that a later decode re-states under other word boundaries is not written twice.

Whisper writes Mandarin in simplified or traditional characters and changes between decodes of
the same stream: PaddleSpeech's demo sentence streamed at D = 2 s came out as
"我认为为跑步...給我帶來了身體健康歡迎..." (the committed "認為" re-read as "认" + "为", the "为"
squeezed against the commit point). The unit cases here are that decode's words and times.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from subd.config import config_from_dict
from subd.errors import ConfigError
from subd.recognise.language import LanguageTracker
from subd.recognise.options import StreamingConfig
from subd.recognise.readings import after_commit_point
from subd.script import script_writer
from subd.types import Word

MS = 1_000_000


def _w(text: str, a: float, b: float) -> Word:
    return Word(text, round(a * 1000) * MS, round(b * 1000) * MS)


def _texts(words) -> list[str]:
    return [w.text for w in words]


def test_each_script_writes_chinese_and_leaves_other_languages_alone():
    assert script_writer("simplified", "zh")("給我帶來了身體健康") == "给我带来了身体健康"
    assert script_writer("taiwan", "zh")("我认为跑步") == "我認為跑步"
    assert script_writer("traditional", "zh")("语音识别") == "語音識別"
    assert script_writer("decoded", "zh") is None
    assert script_writer("simplified", "ja") is None  # Japanese kanji are not converted
    assert script_writer("simplified", "en") is None


def test_the_recogniser_writes_a_decode_in_the_channel_script():
    words = [_w("認為", 0.54, 0.74), _w("跑步", 0.74, 1.1)]
    zh = LanguageTracker("zh", None, script="simplified")
    assert _texts(zh.written(words)) == ["认为", "跑步"]
    assert zh.written(words)[0].start_ns == words[0].start_ns  # times untouched
    assert _texts(LanguageTracker("zh", None, script="decoded").written(words)) == ["認為", "跑步"]
    assert _texts(LanguageTracker("en", None).written([_w("Hello", 0, 1)])) == ["Hello"]


def test_a_bad_script_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match=r"^\[recognizer\] chinese_script"):
        config_from_dict({"recognizer": {"chinese_script": "klingon"}})
    with pytest.raises(ConfigError,
                       match=r"^\[recognizer\] chinese_script = 'klingon': must be one of"):
        StreamingConfig(chinese_script="klingon")
    cfg = config_from_dict({"recognizer": {"language": "zh", "chinese_script": "taiwan"}})
    assert cfg.recognizer.chinese_script == "taiwan"


def test_a_committed_word_restated_as_other_characters_is_dropped():
    committed = [_w("我", 0.14, 0.54), _w("认为", 0.54, 0.74)]
    decode = [_w("为", 0.74, 0.78), _w("跑", 0.78, 0.98), _w("步", 0.98, 1.14)]
    for deadline in (False, True):
        kept = after_commit_point(decode, committed, committed[-1].end_ns, deadline=deadline)
        assert _texts(kept) == ["跑", "步"]
    # two committed words re-stated as one
    committed = [_w("就", 1.70, 1.86), _w("是", 1.86, 2.04)]
    kept = after_commit_point([_w("就是", 1.95, 2.05), _w("给", 2.54, 2.94)], committed,
                              committed[-1].end_ns)
    assert _texts(kept) == ["给"]


def test_a_character_said_again_on_audio_of_its_own_is_kept():
    committed = [_w("哈哈", 1.0, 1.4)]
    kept = after_commit_point([_w("哈", 1.42, 1.62), _w("好", 1.7, 1.9)], committed,
                              committed[-1].end_ns)
    assert _texts(kept) == ["哈", "好"]
    # characters that do not end the committed text are new
    kept = after_commit_point([_w("为", 0.74, 0.78)], [_w("认识", 0.54, 0.74)], 740 * MS)
    assert _texts(kept) == ["为"]


def test_transcribe_refuses_an_unknown_script_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "subd.cli", "transcribe", "x.wav", "-o",
                           str(tmp_path / "x.srt"), "--chinese-script", "klingon"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "invalid choice: 'klingon'" in proc.stderr
