"""Decoder passes that skip work: logits for chosen rows only, cross-attention keys/values
computed once per window, forced prefixes whose words are not returned again."""

from __future__ import annotations

import pytest
import torch

from subd.sources.decode import load_audio


def test_logit_rows_select_the_same_logits(engine):
    dec = engine.model.decoder
    feats = torch.randn(1, 1500, dec.dims.n_text_state)
    tokens = torch.tensor([engine.build_prompt(engine.tokenizer.encode(" hello there"))[0]])
    full, _ = dec(tokens, dec.new_cache(feats))
    rows, _ = dec(tokens, dec.new_cache(feats), logit_rows=(1, -1))
    assert rows.shape == (1, 2, dec.dims.n_vocab)
    torch.testing.assert_close(rows[0, 0], full[0, 1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rows[0, 1], full[0, -1], atol=1e-4, rtol=1e-4)


def test_window_shares_cross_attention_without_changing_words(engine, speech_clips):
    """transcribe_window computes the cross-attention keys/values once for the decode and the
    alignment: same tokens, same word times and probabilities as computing them each time."""
    audio = load_audio(speech_clips[1].path)
    shared = engine.transcribe_window(audio)
    feats = engine.encode(engine.features(audio))
    alone = engine.decode_with_fallback(feats, None)
    assert shared.decode.tokens == alone.tokens
    text = alone.text_tokens(engine.tokenizer.special.timestamp_begin)
    words = engine.align(feats, text, min(engine.features(audio).shape[-1] - 1, 3000))
    assert len(words) >= 5
    assert [(w.text, w.start_s, w.end_s) for w in shared.words] == [
        (w.text, w.start_s, w.end_s) for w in words
    ]
    assert [w.probability for w in shared.words] == pytest.approx([w.probability for w in words])


def test_prefix_words_are_not_returned_again(engine, speech_clips):
    """With a forced prefix only the words decoded after it come back, timed as in a decode
    without the prefix (the prefix's words were timed by an earlier window)."""
    audio = load_audio(speech_clips[1].path)
    full = engine.transcribe_window(audio)
    tok = engine.tokenizer
    n_known = 3
    prefix_text = "".join(w.text for w in full.words[:n_known])
    prefixed = engine.transcribe_window(
        audio, prefix=(tok.special.timestamp_begin, *tok.encode(prefix_text))
    )
    assert [w.text for w in prefixed.words] == [w.text for w in full.words[n_known:]]
    for a, b in zip(prefixed.words, full.words[n_known:], strict=True):
        assert abs(a.start_s - b.start_s) <= 0.1 and abs(a.end_s - b.end_s) <= 0.1


def test_words_carry_the_marks_whisper_weighed_after_them(engine, speech_clips):
    """Each decoded word carries (p('.'), p(',')) of the step after its letters: where Whisper
    wrote a full stop or a comma it weighed that mark over the other, and every word of a
    decode after a forced prefix carries them too (the deadline's comma rule reads them)."""
    clip = next(c for c in speech_clips if "0920" in str(c.path))  # "woman, he ... was."
    audio = load_audio(clip.path)
    out = engine.transcribe_window(audio)
    tok = engine.tokenizer
    n_text = len(out.decode.text_tokens(tok.special.timestamp_begin))
    assert len(out.decode.mark_probs) == len(out.decode.tokens) + 1  # the end of text's step
    assert len(out.decode.marks_after_text(tok.special.timestamp_begin)) == n_text
    words = [w for w in out.words if w.text.strip() not in ("Mr.", "Mrs.")]
    assert all(w.mark_p is not None for w in words)
    stops = [w.mark_p for w in words if w.text.endswith(".")]
    commas = [w.mark_p for w in words if w.text.endswith(",")]
    bare = [w.mark_p for w in words if w.text.strip()[-1].isalnum()]
    assert stops and commas and bare
    assert all(p_stop > p_comma for p_stop, p_comma in stops), stops
    assert all(p_comma > p_stop for p_stop, p_comma in commas), commas
    assert all(p_stop < 0.5 and p_comma < 0.5 for p_stop, p_comma in bare), bare
    n_known = 4
    prefix = (tok.special.timestamp_begin, *tok.encode("".join(w.text for w in
                                                               out.words[:n_known])))
    after = engine.transcribe_window(audio, prefix=prefix)
    assert after.words and all(w.mark_p is not None for w in after.words)
