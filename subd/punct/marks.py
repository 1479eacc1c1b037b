"""Punctuation for Chinese and Japanese words: the recogniser's own marks, decided with right
context, in place of the English CRF.

The shipped CRF was trained on English text: on CJK words it would invent English sentence
ends. A CRF for Chinese trained on fortunes-zh's punctuated text was not built (not measured
against the recogniser's marks, so not shipped). For words holding CJK characters the tag is
therefore the mark Whisper wrote after the word ("很好，" -> ","), full-width marks read as their
half-width tags and shown full-width again by the layout. The stream around it
(:class:`subd.punct.stream.PunctStream`) still decides a word only once its right context is
there. The chunk-edge rule applies to CJK marks here: a full stop ('。') Whisper wrote on the last
word of a decoded window stands only with a pause of ``edge_pause_ms`` after it (the stream's
own rule reads half-width marks only); '？' and '！' stand, as they do in English: Whisper closes a
decode with a full stop whatever was said, not with a question mark. Words in other scripts keep
the CRF's tags.
"""

from __future__ import annotations

from collections.abc import Sequence

from subd.models.punct import RecogniserMark, WordTag
from subd.punct.stream import PunctConfig, edge_mark_set_aside
from subd.script import has_cjk

# full-width (and half-width) marks -> the tagger's marks
_TAG_OF = {"，": ",", "、": ",", "；": ",", "：": ",", "。": ".", "？": "?", "！": "!",
           ",": ",", ";": ",", ":": ",", ".": ".", "?": "?", "!": "!"}
_BREAK_AFTER = {".": 1.0, "?": 1.0, "!": 1.0, ",": 0.5, "": 0.0}


def mark_of(text: str) -> str:
    """The tag for the mark that ends ``text`` ("" when none)."""
    return _TAG_OF.get(text.strip()[-1:], "")


class ScriptTagger:
    """A ``PunctTagger`` that tags CJK words with the recogniser's marks, others with ``crf``."""

    def __init__(self, crf, edge_pause_ms: float | None = None) -> None:
        self.crf = crf
        # [punct] pause_commit_ms, as the stream's own rule (None: its default)
        self.edge_pause_ms = PunctConfig().pause_commit_ms if edge_pause_ms is None \
            else edge_pause_ms

    def tag(
        self,
        words: Sequence[str],
        pauses_ms: Sequence[float | None] | None = None,
        right_context_complete: bool = True,
        fixed: Sequence[tuple[str, str] | None] | None = None,
        stream_start: bool = True,
        recogniser: Sequence[RecogniserMark | None] | None = None,
    ) -> list[WordTag]:
        cjk = [has_cjk(w) for w in words]
        if not any(cjk):
            return self.crf.tag(words, pauses_ms, right_context_complete, fixed, stream_start,
                                recogniser)
        if all(cjk):
            tags = [WordTag("", "lower", 0.0)] * len(words)
        else:
            tags = self.crf.tag(words, pauses_ms, right_context_complete, fixed, stream_start,
                                recogniser)
        out = []
        for i, (word, tag) in enumerate(zip(words, tags, strict=True)):
            if not cjk[i]:
                out.append(tag)
            elif fixed is not None and fixed[i] is not None:
                punct = fixed[i][0]
                out.append(WordTag(punct, fixed[i][1], _BREAK_AFTER.get(punct, 0.0)))
            else:
                # a mark the stream set aside (None) is no mark
                mark = recogniser[i] if recogniser is not None else None
                punct = "" if recogniser is not None and mark is None else mark_of(word)
                pause = pauses_ms[i] if pauses_ms is not None else None
                last = right_context_complete and i == len(words) - 1
                if (mark is not None and not last
                        and edge_mark_set_aside(punct, mark, pause, self.edge_pause_ms)):
                    punct = ""  # the chunk-edge rule (subd.punct.stream) for CJK marks
                out.append(WordTag(punct, "lower", _BREAK_AFTER[punct]))
        return out
