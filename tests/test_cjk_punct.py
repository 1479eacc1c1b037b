"""Chinese words keep the recogniser's marks, decided with right context; English keeps the CRF."""

from __future__ import annotations

import pytest

from subd.layout.cues import token_of
from subd.models.punct import PunctTagger, recogniser_marks_of
from subd.punct.marks import ScriptTagger
from subd.punct.stream import PunctStream
from subd.types import Word
from subd.workers.hosts import make_punct_stream

MS = 1_000_000


@pytest.fixture(scope="module")
def crf() -> PunctTagger:
    return PunctTagger.load()


def words(texts: list[str], gap_after: dict[int, int] | None = None) -> list[Word]:
    out, t = [], 0
    for i, text in enumerate(texts):
        out.append(Word(text, t, t + 200 * MS))
        t += 250 * MS + (gap_after or {}).get(i, 0) * MS
    return out


def test_english_tags_are_the_crfs(crf):
    ws = words("where are you going tonight i am going home".split(), {4: 800})
    texts = [w.text for w in ws]
    pauses = [50.0] * 4 + [850.0] + [50.0] * 3 + [None]
    marks = recogniser_marks_of(ws)
    assert ScriptTagger(crf).tag(texts, pauses, recogniser=marks) == \
        crf.tag(texts, pauses, recogniser=marks)


def test_chinese_words_keep_the_recognisers_marks_shown_full_width(crf):
    texts = ["今", "天", "天", "气", "很", "好，", "我们", "去", "公", "园", "吧。"]
    stream = PunctStream(ScriptTagger(crf))
    ws = words(texts)
    upd = stream.update(ws, (), ws[-1].end_ns + 2000 * MS)
    decided = list(upd.final) + list(stream.flush().final)
    assert [t.word.text for t in decided] == texts
    shown = "".join(token_of(t).text for t in decided)
    assert shown == "今天天气很好，我们去公园吧。"
    assert [t.punct for t in decided if t.punct] == [",", "."]
    assert decided[5].break_after > 0 and decided[-1].break_after == 1.0


def test_a_full_stop_at_a_window_edge_needs_a_pause(crf):
    texts = ["今", "天", "很", "好。", "我们", "去", "公", "园"]
    ws = words(texts)
    tagger = ScriptTagger(crf)
    marks = recogniser_marks_of(ws[:4], 0)  # "好。" ended its decoded window
    marks += recogniser_marks_of(ws[4:], 0)
    pauses = [50.0] * 7 + [None]
    tags = tagger.tag(texts, pauses, right_context_complete=False, recogniser=marks)
    assert tags[3].punct == ""  # no pause after it: the mark is Whisper's window edge
    pauses[3] = 600.0
    tags = tagger.tag(texts, pauses, right_context_complete=False, recogniser=marks)
    assert tags[3].punct == "."
    # the pause it needs is the stream's [punct] pause_commit_ms (make_punct_stream passes it)
    tags = ScriptTagger(crf, edge_pause_ms=800.0).tag(texts, pauses, right_context_complete=False,
                                                      recogniser=marks)
    assert tags[3].punct == ""
    assert make_punct_stream(pause_commit_ms=800.0).tagger.edge_pause_ms == 800.0


def test_a_question_mark_at_a_window_edge_stands_without_a_pause(crf):
    texts = ["你", "去", "哪", "儿？", "我们", "去", "公", "园"]
    ws = words(texts)
    marks = recogniser_marks_of(ws[:4], 0) + recogniser_marks_of(ws[4:], 0)
    pauses = [50.0] * 7 + [None]
    tags = ScriptTagger(crf).tag(texts, pauses, right_context_complete=False, recogniser=marks)
    assert tags[3].punct == "?"
