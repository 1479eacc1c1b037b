"""The streaming recogniser: committed words never change, WER close to offline, bounded window."""

from __future__ import annotations

import numpy as np
import pytest

from subd.errors import ConfigError
from subd.recognise.streaming import StreamingConfig, StreamingRecognizer
from subd.sources.decode import load_audio
from subd.types import SAMPLE_RATE_HZ, AudioChunk, samples_to_ns
from tests.conftest import normalise, word_errors

STEP_SAMPLES = SAMPLE_RATE_HZ // 2  # an update every 0.5 s of audio: deterministic cadence


def stream(rec: StreamingRecognizer, audio: np.ndarray, step: int = STEP_SAMPLES):
    """Feed ``audio`` in steps, update after each; return (all committed words, updates)."""
    committed, updates = [], []
    for start in range(0, len(audio), step):
        rec.accept(AudioChunk(start, audio[start : start + step]))
        hyp = rec.update()
        updates.append(hyp)
        committed.extend(hyp.committed)
        window_s = (rec.audio.end_sample - rec.state.window_start) / SAMPLE_RATE_HZ
        assert window_s <= 30.0
    final = rec.finish()
    updates.append(final)
    committed.extend(final.committed)
    return committed, updates


@pytest.fixture(scope="module")
def int8_engine():
    from subd.models.engine import WhisperEngine

    return WhisperEngine.load("tiny.en", quantize=True)


@pytest.fixture(scope="module")
def joined(speech_clips):
    parts, ref = [], []
    for clip in speech_clips:
        parts += [load_audio(clip.path), np.zeros(12_000, np.float32)]
        ref += clip.transcript.split()
    return np.concatenate(parts), ref


def test_streaming_wer_within_1_5_points_of_offline(int8_engine, joined):
    from subd.recognise.offline import Transcriber

    audio, ref = joined
    offline_words = [
        w.text for s in Transcriber(int8_engine).transcribe_blocks([audio]) for w in s.words
    ]
    offline = word_errors(ref, normalise(" ".join(offline_words))) / len(ref)
    committed, _ = stream(StreamingRecognizer(engine=int8_engine), audio)
    streamed = word_errors(ref, normalise(" ".join(w.text for w in committed))) / len(ref)
    print(f"WER offline {offline:.1%}, streaming {streamed:.1%}")
    assert streamed <= offline + 0.015


def test_a_streams_first_word_is_kept_driven_alone(int8_engine, speech_clips):
    """Until its first commit a stream decodes on Whisper's full input: on the cut span tiny.en
    read LibriVox 0870's opening "And Mr. John" as "Mr. John", and agreement committed that."""
    clip = next(c for c in speech_clips if c.path.name.endswith("0870.wav"))
    committed, _ = stream(StreamingRecognizer(engine=int8_engine), load_audio(clip.path))
    assert normalise(" ".join(w.text for w in committed[:3])) == ["and", "mister", "john"]


def test_committed_words_are_final_and_ordered(int8_engine, joined):
    audio, _ = joined
    committed, updates = stream(StreamingRecognizer(engine=int8_engine), audio)
    starts = [w.start_ns for w in committed]
    assert starts == sorted(starts)
    assert all(w.start_ns <= w.end_ns for w in committed)
    for a, b in zip(committed, committed[1:], strict=False):
        assert a.end_ns <= b.start_ns  # no overlap: nothing committed twice
    # tentative words always lie after everything committed so far
    seen_end = 0
    for hyp in updates:
        if hyp.committed:
            seen_end = hyp.committed[-1].end_ns
        assert all(w.end_ns >= seen_end for w in hyp.tentative)


def test_long_speech_without_pauses_never_overflows_the_window(int8_engine, speech_clips):
    """40 s of speech with no pause: forced commits keep the window under 30 s, no words lost."""
    clips = [load_audio(c.path) for c in speech_clips]
    audio = np.concatenate(clips + clips)[: 40 * SAMPLE_RATE_HZ]
    ref = " ".join(c.transcript for c in speech_clips).split() * 2
    rec = StreamingRecognizer(engine=int8_engine, max_window_ms=12000, trim_after_ms=20000)
    committed, _ = stream(rec, audio, step=SAMPLE_RATE_HZ)
    hyp = normalise(" ".join(w.text for w in committed))
    # 40 s covers about 1.6 passes of the clips; compare against the matching prefix
    ref = ref[: len(hyp) + 3]
    assert word_errors(ref, hyp) / len(ref) < 0.2


def test_hours_of_silence_cost_no_decodes(int8_engine):
    rec = StreamingRecognizer(engine=int8_engine)
    step = SAMPLE_RATE_HZ
    zeros = np.zeros(step, np.float32)
    for k in range(600):  # 10 minutes
        rec.accept(AudioChunk(k * step, zeros))
        hyp = rec.update()
        assert hyp.committed == () and hyp.tentative == ()
    assert rec.n_decodes == 0
    assert rec.audio.end_sample - rec.state.window_start <= 30 * SAMPLE_RATE_HZ


def test_config_is_validated():
    with pytest.raises(ConfigError, match=r"\[recognizer\] max_window_ms"):
        StreamingConfig(max_window_ms=40000)


class _Tokenizer:
    """Enough of Whisper's tokenizer for the prompt and the forced prefix of a scripted
    decode (the script ignores them)."""

    multilingual = False
    special = type("Special", (), {"timestamp_begin": 50363})

    def encode(self, text: str) -> list[int]:
        return [1] * len(text.split())


class _ScriptedEngine:
    """Stands in for Whisper: decode i returns ``scripts[i]`` (the last one from then on), as
    (text, start_s, end_s, probability) relative to the window start."""

    def __init__(self, *scripts: list[tuple[str, float, float, float]]):
        self.scripts = scripts
        self.n_calls = 0
        self.tokenizer = _Tokenizer()

    def transcribe_window(self, audio, prompt=None, policy=None, prefix=(), **_):
        from subd.models.alignment import WordTiming
        from subd.models.decoding import DecodeResult
        from subd.models.engine import WindowResult

        script = self.scripts[min(self.n_calls, len(self.scripts) - 1)]
        self.n_calls += 1
        timed = tuple(WordTiming(" " + w, (), start, end, p) for w, start, end, p in script)
        decode = DecodeResult(tokens=(), sum_logprob=0.0, avg_logprob=0.0, no_speech_prob=0.0,
                              temperature=0.0, compression_ratio=1.0, looped=False)
        return WindowResult(decode=decode, words=timed, is_speech=True)


def _voiced(audio: np.ndarray, n_frames: int, n_voiced: int = 5) -> np.ndarray:
    """``n_frames`` × 30 ms of ``audio`` whose last ``n_voiced`` frames the VAD calls speech."""
    from subd.recognise.vad import FRAME_SAMPLES, VoiceActivityDetector

    mask = VoiceActivityDetector().speech_mask(audio)
    for i in range(n_frames - n_voiced, len(mask) - n_voiced):
        if mask[i : i + n_voiced].all():
            end = i + n_voiced
            return audio[(end - n_frames) * FRAME_SAMPLES : end * FRAME_SAMPLES]
    raise AssertionError("no voiced stretch")


def _settled_s(words, audio: np.ndarray) -> float:
    rec = StreamingRecognizer(engine=_ScriptedEngine(words), confident_min_probability=1.0)
    rec.accept(AudioChunk(0, audio))
    return rec.update().audio_end_ns / 1e9


def test_settled_end_stops_at_speech_not_yet_transcribed(speech_clips):
    """The gap after the last recognised word is a pause only up to where speech starts again:
    a word onset of 150 ms at the end of the audio is not silence (the tagger would end a
    sentence there)."""
    clip = load_audio(speech_clips[0].path)
    speech = _voiced(clip, 50)  # 1.5 s, the "word"
    onset = _voiced(clip[SAMPLE_RATE_HZ * 3 :], 5)  # 150 ms of the next word
    gap = np.zeros(SAMPLE_RATE_HZ * 8 // 10, np.float32)
    words = [("word", 0.0, 1.5, 0.99)]
    silent_s = _settled_s(words, np.concatenate([speech, gap, gap]))
    assert silent_s == pytest.approx(3.1, abs=0.01)  # only silence after the word: all settled
    onset_s = _settled_s(words, np.concatenate([speech, gap, onset]))
    assert 1.5 <= onset_s <= 2.3 + 0.01  # up to the onset, not the 2.45 s audio end


def test_settled_end_is_not_held_back_by_the_last_words_own_end(speech_clips):
    """A word's aligned end is often early: its last 100 ms of sound is no new speech."""
    clip = load_audio(speech_clips[0].path)
    speech = _voiced(clip, 50)
    gap = np.zeros(SAMPLE_RATE_HZ, np.float32)
    words = [("word", 0.0, 1.4, 0.99)]  # 100 ms before the speech ends
    assert _settled_s(words, np.concatenate([speech, gap])) == pytest.approx(2.5, abs=0.01)


def test_a_sentence_end_aligned_early_still_settles_with_the_pause_after_it(speech_clips):
    """Whisper aligns a sentence's last word 200-300 ms before its sound ends: with silence
    after that sound, the pause is there (the tagger reads it); with none heard yet, the sound
    may be the next word, and the hypothesis is not settled past the word."""
    clip = load_audio(speech_clips[0].path)
    speech = _voiced(clip, 50)
    words = [("word.", 0.0, 1.25, 0.99)]  # 250 ms before the speech ends
    gap = np.zeros(SAMPLE_RATE_HZ, np.float32)
    assert _settled_s(words, np.concatenate([speech, gap])) == pytest.approx(2.5, abs=0.01)
    short = np.zeros(SAMPLE_RATE_HZ // 10, np.float32)  # 100 ms: no pause heard yet
    assert _settled_s(words, np.concatenate([speech, short])) <= 1.3


def test_finish_commits_the_last_word_once(speech_clips):
    """At the end of the stream the final decode and the last hypothesis hold the same word
    with slightly different times: it is committed once ("news", not "news news")."""
    audio = _voiced(load_audio(speech_clips[0].path), 67)  # 2 s
    hyp = [("local", 0.5, 1.0, 0.5), ("news.", 1.0, 1.6, 0.5)]
    final = [("local", 0.5, 1.0, 0.5), ("news.", 1.0, 1.55, 0.5)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(hyp, final), confident_min_probability=1.0)
    rec.accept(AudioChunk(0, audio))
    assert rec.update().committed == ()
    assert [w.text for w in rec.finish().committed] == ["local", "news."]


def test_a_looping_decode_is_bounded_by_the_window(int8_engine, speech_clips):
    """Looped audio invites Whisper to repeat the sentence its prompt already holds, up to
    ~180 words for 2 s of audio. The window's token budget bounds every hypothesis."""
    from subd.recognise.streaming import TOKENS_BASE, TOKENS_PER_S

    clip = next(c for c in speech_clips if "0870" in c.path.name)
    audio = np.tile(load_audio(clip.path), 4)
    rec = StreamingRecognizer(engine=int8_engine)
    most = 0.0
    for start in range(0, len(audio), STEP_SAMPLES):
        rec.accept(AudioChunk(start, audio[start : start + STEP_SAMPLES]))
        hyp = rec.update()
        window_s = (rec.audio.end_sample - rec.state.window_start) / SAMPLE_RATE_HZ
        inside = [w for w in (*rec.state.committed, *hyp.tentative)
                  if w.end_ns > samples_to_ns(rec.state.window_start)]
        most = max(most, len(inside) / (TOKENS_BASE + TOKENS_PER_S * window_s))
    print(f"capped decodes {rec.n_capped} of {rec.n_decodes}; most words per budget {most:.2f}")
    assert most <= 1.0


@pytest.mark.parametrize("n_decodes", [3, 100])
def test_an_unsure_word_commits_when_three_decodes_in_a_row_agree(speech_clips, n_decodes):
    """Whisper gives a sentence's first word after a pause a low probability however often it
    hears it: three decodes in a row that heard it out and agree commit it (two do not)."""
    audio = _voiced(load_audio(speech_clips[0].path), 100)  # 3 s
    unsure = [("Unless", 1.0, 1.4, 0.1), ("to", 1.4, 1.5, 0.9)]
    other = [("And", 1.0, 1.4, 0.1), ("to", 1.4, 1.5, 0.9)]
    rec = StreamingRecognizer(engine=_ScriptedEngine(unsure, other, unsure, unsure, unsure),
                              unsure_agree_decodes=n_decodes, confident_min_probability=1.0)
    committed_at = {}
    for end_s in (1.6, 1.8, 2.0, 2.2, 2.4):  # "Unless" is heard out (150 ms guard) from 1.55 s
        end = int(end_s * SAMPLE_RATE_HZ)
        rec.accept(AudioChunk(rec.audio.end_sample, audio[rec.audio.end_sample : end]))
        for w in rec.update().committed:
            committed_at[w.text] = end_s
    if n_decodes == 3:  # "And" at 1.8 s broke the run: 2.0, 2.2, 2.4 are three in a row
        assert committed_at == {"Unless": 2.4, "to": 2.4}  # "to" (sure) had only waited
    else:  # two unsure guesses never commit; max_tentative_ms does, from 2.6 s
        assert committed_at == {}


def test_a_mark_alone_is_no_word_and_the_first_word_is_kept(int8_engine, speech_clips):
    """Deadline mode, Whisper's full input, a short horizon (a fast device at D = 1 s): the
    first decode of LibriVox 0870 ("And Mr. John Dashwood ...") hears its first breath as " ."
    alone. Committed as a word, it was forced into every later prefix and "And" was lost."""
    clip = next(c for c in speech_clips if c.path.stem.endswith("0870"))
    audio = load_audio(clip.path)[: 2 * SAMPLE_RATE_HZ]
    rec = StreamingRecognizer("tiny.en", engine=int8_engine)
    step = SAMPLE_RATE_HZ // 5
    committed = []
    for start in range(0, len(audio), step):
        rec.accept(AudioChunk(start, audio[start : start + step]))
        until = max(0, samples_to_ns(start + step) - 300_000_000)
        committed += rec.update(commit_until_ns=until, full_span=True).committed
    texts = [w.text for w in committed]
    assert all(any(ch.isalnum() for ch in t) for t in texts), texts
    assert normalise(texts[0]) == ["and"], texts


def test_a_decodes_marks_close_the_word_before_them_and_symbols_stay_words():
    from subd.models.alignment import WordTiming
    from subd.recognise.readings import hypothesis_words

    def timed(*texts):
        return [WordTiming(t, (), 0.3 * i, 0.3 * i + 0.25, 0.9) for i, t in enumerate(texts)]

    words = hypothesis_words(timed(" .", " rock", " &", " roll", " ?", " 50", "%"), 10**9)
    assert [w.text for w in words] == ["rock", "&", "roll?", "50%"]
    assert words[0].start_ns == 10**9 + 300_000_000  # times stay each word's own


def test_a_committed_word_the_window_start_cuts_is_the_prompts_last_word(int8_engine):
    """A window that starts inside a committed word (after a stall it starts 0.2 s before the
    commit point) gets that word in its prompt: it is no prefix word (those start inside the
    window), and a prompt without it ended "... is to be" where the speaker had closed the
    sentence with "ill-disposed.": Whisper went on in lower case without commas."""
    from subd.types import Word

    seen = []

    class Recording:
        tokenizer = int8_engine.tokenizer

        def transcribe_window(self, audio, prompt=None, policy=None, **kwargs):
            seen.append((prompt, kwargs.get("prefix", ())))
            return int8_engine.transcribe_window(audio, prompt, policy, **kwargs)

    rec = StreamingRecognizer(engine=Recording())
    s = 1_000_000_000
    rec.state.committed = [Word("is", 12 * s, 12_300_000_000), Word("to", 12_300_000_000, 13 * s),
                           Word("be", 13 * s, 13_400_000_000),
                           Word("ill-disposed.", 13_400_000_000, 14_200_000_000)]
    rec.state.committed_end_ns = 14_200_000_000
    rec.state.window_start = 14 * SAMPLE_RATE_HZ  # inside "ill-disposed."
    rec._decode(np.zeros(2 * SAMPLE_RATE_HZ, np.float32))
    prompt, prefix = seen[0]
    assert int8_engine.tokenizer.decode(prompt) == " is to be ill-disposed."
    assert prefix == ()


@pytest.mark.parametrize("agreed_by", [2, 1])
def test_words_committed_for_their_age_keep_the_reading_two_decodes_agreed_on(speech_clips,
                                                                              agreed_by):
    """Driven alone: two decodes read a sentence's first words "Unless to", unsure of them, and
    the third, whose words then reached max_tentative_ms, changed them to "I must". The two
    outvote it (tiny.en on LibriVox 0880, tests/test_streaming's joined stream). A reading only
    one decode gave does not."""
    audio = _voiced(load_audio(speech_clips[0].path), 100)  # 3 s
    unsure = [("Unless", 1.0, 1.4, 0.1), ("to", 1.4, 1.5, 0.1), ("be", 1.5, 1.7, 0.9)]
    changed = [("I", 1.0, 1.3, 0.6), ("must", 1.3, 1.5, 0.6), ("be", 1.5, 1.7, 0.9)]
    other = [("And", 1.0, 1.4, 0.1), ("to", 1.4, 1.5, 0.1), ("be", 1.5, 1.7, 0.9)]
    scripts = [unsure, unsure] if agreed_by == 2 else [other, unsure]
    rec = StreamingRecognizer(engine=_ScriptedEngine(*scripts, changed), max_tentative_ms=1000,
                              unsure_agree_decodes=100, confident_min_probability=1.0)
    committed = []
    for end_s in (1.8, 2.0, 2.6):  # at 2.6 s "I" and "must" are over 1 s old
        end = int(end_s * SAMPLE_RATE_HZ)
        rec.accept(AudioChunk(rec.audio.end_sample, audio[rec.audio.end_sample : end]))
        committed += [w.text for w in rec.update().committed]
    assert committed == (["Unless", "to"] if agreed_by == 2 else ["I", "must"])
    assert [w.text for w in rec.state.previous] == ["be"]


def test_a_window_gone_silent_leaves_no_streaks_behind_its_words():
    """Silence after tentative words commits them (_on_silence) and clears their streaks with
    them: a streak left over outlived its words, and the next decode that read on from an
    earlier reading (_unread_tail) failed on the two lists."""
    from subd.types import Word

    rec = StreamingRecognizer(engine=_ScriptedEngine([]))
    rec.accept(AudioChunk(0, np.zeros(2 * SAMPLE_RATE_HZ, np.float32)))
    rec.state.previous = [Word("over", 200_000_000, 500_000_000)]
    rec.state.previous_streak = [1]
    hyp = rec.update(commit_until_ns=0)
    assert [w.text for w in hyp.committed] == ["over"]
    assert rec.state.previous == [] and rec.state.previous_streak == []
