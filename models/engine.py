"""The Whisper engine: front end, encoder, decoding with fallback, and word timings.

``WhisperEngine.transcribe_window`` turns up to 30 s of 16 kHz audio into words with times; the
offline transcriber and the streaming recogniser are both built on it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from subd.kernels.mel import WINDOW_FRAMES, log_mel, pad_or_trim_frames
from subd.models.alignment import WordTiming, align_words, within_segments
from subd.models.cache import load_cached
from subd.models.decoding import DecodeOptions, DecodeResult, decode_window, detect_language
from subd.models.loading import LoadedModel
from subd.models.portable import load_weights
from subd.models.whisper import KVCache
from subd.models.words import MAX_PROMPT_TOKENS, word_splitter
from subd.torch_threads import torch_threads, usable_cores

SAMPLE_RATE_HZ = 16_000
WINDOW_SAMPLES = 30 * SAMPLE_RATE_HZ
MULTILINGUAL_VOCAB = 51865  # a vocabulary this large has the language tokens


@dataclass(frozen=True, slots=True)
class FallbackPolicy:
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float = 2.4
    logprob_threshold: float = -1.0
    no_speech_threshold: float = 0.6
    max_fallback_tokens: int = 96  # cap a retry's cost: a fallback never decodes the full 448

    def silent(self, result: DecodeResult) -> bool:
        """Whisper heard no speech: likely silence and an unsure reading (the caller drops it;
        no point decoding it again)."""
        return (result.no_speech_prob > self.no_speech_threshold
                and result.avg_logprob < self.logprob_threshold)

    def failed(self, result: DecodeResult) -> bool:
        """A reading to decode again at the next temperature: looped, repeating itself
        (compression ratio) or unsure on average."""
        return (result.looped or result.compression_ratio > self.compression_ratio_threshold
                or result.avg_logprob < self.logprob_threshold)

    def attempt(self, options: DecodeOptions, i: int) -> DecodeOptions:
        """``options`` for attempt ``i``: its temperature, and a retry's tokens capped."""
        opts = replace(options, temperature=self.temperatures[i])
        if i == 0:
            return opts
        return replace(opts, max_new_tokens=min(opts.max_new_tokens, self.max_fallback_tokens))

    def to_retry(self, rows: list[int], got: list[DecodeResult],
                 results: list[DecodeResult | None]) -> list[int]:
        """Batched fallback: each row's reading into ``results``; the rows whose reading
        failed, and was no silence, go again at the next temperature."""
        retry = []
        for r, res in zip(rows, got, strict=True):
            results[r] = res
            if self.failed(res) and not self.silent(res):
                retry.append(r)
        return retry


DEFAULT_POLICY = FallbackPolicy()
DEFAULT_OPTIONS = DecodeOptions()
MEL_FRAMES_PER_S = 100


@dataclass(frozen=True, slots=True)
class EncoderSpan:
    """How much of Whisper's 30 s input the encoder runs over (whisper.cpp calls it audio_ctx).

    Whisper was trained on 30 s windows, zero-padded; the encoder's cost grows with the frames it
    sees, padding included (tiny.en, one core: ~255 ms for 30 s). A live window holds a few
    seconds of audio, so the live recogniser encodes only the audio plus ``pad_ms`` of padding,
    rounded up to ``bucket_ms`` so few shapes recur. The padding is what keeps the model on
    familiar ground at the audio's end: with none, the last words come out worse. ``pad_ms`` 0
    (``FULL_SPAN``) encodes the whole 30 s, as offline transcription does.
    """

    pad_ms: int = 0
    bucket_ms: int = 1000

    def frames(self, n_mel_frames: int) -> int:
        """Mel frames to encode for ``n_mel_frames`` of audio (even, ≤ the 30 s window)."""
        if self.pad_ms <= 0:
            return WINDOW_FRAMES
        bucket = max(2, self.bucket_ms * MEL_FRAMES_PER_S // 1000 // 2 * 2)
        want = n_mel_frames + self.pad_ms * MEL_FRAMES_PER_S // 1000
        return min(WINDOW_FRAMES, -(-want // bucket) * bucket)


FULL_SPAN = EncoderSpan()


@dataclass(frozen=True, slots=True)
class WindowResult:
    decode: DecodeResult
    words: tuple[WordTiming, ...]  # times relative to the window start
    is_speech: bool
    prefix_used: bool = False  # words start after the forced prefix (see transcribe_window)


class WhisperEngine:
    def __init__(self, loaded: LoadedModel, *, threads: int | None = None, language: str = "en"):
        if threads:
            torch.set_num_threads(threads)
        # One decode step is a chain of tiny matrix-vector products: extra threads only add
        # synchronisation (and stall badly on a busy machine), so steps run on one thread.
        self.decoder_threads = 1
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.language = language if self.tokenizer.multilingual else "en"
        self.sot_sequence = self.tokenizer.sot_sequence(self.language)
        self.n_mels = self.model.dims.n_mels

    @classmethod
    def load(
        cls,
        model: str = "tiny.en",
        *,
        threads: int | None = None,
        quantize: bool = False,
        language: str = "en",
        cache: bool = True,
    ) -> WhisperEngine:
        """``cache``: through the converted-weights cache (models.cache), which makes a
        respawned stage process's load a file read instead of a conversion."""

        def build() -> LoadedModel:
            loaded = load_weights(model)
            if not quantize:
                return loaded
            # in place: the float model is ours, and a copy of it cost 0.7 s
            return replace(loaded, model=quantize_linears(loaded.model, inplace=True))

        variant = "int8" if quantize else "fp32"
        loaded = load_cached(model, variant, build) if cache else build()
        return cls(loaded, threads=threads or _default_threads(), language=language)

    def features(self, audio: np.ndarray) -> torch.Tensor:
        """audio [n] -> log-mel [n_mels, n_frames] (n_frames = n//160 + 1)."""
        with torch_threads(1):  # one STFT of ≤ 30 s: ~7 ms on one core, slower when split
            return log_mel(audio, self.n_mels)

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor, n_frames: int = WINDOW_FRAMES) -> torch.Tensor:
        """mel [n_mels, ≤n_frames] -> audio features [1, n_frames/2, D] (zero-padded window)."""
        # the front end runs on the CPU; the model may sit on a GPU (subd.gpu.device.load_engine)
        mel = mel.to(self.model.encoder.conv1.weight.device)
        return self.model.encoder(pad_or_trim_frames(mel, n_frames)[None])

    @torch.inference_mode()
    def cross_cache(self, audio_features: torch.Tensor) -> KVCache:
        """The decoder's cross-attention keys/values for ``audio_features`` [1, T, D]."""
        return self.model.decoder.new_cache(audio_features)

    def sot_for(self, language: str | None) -> list[int]:
        """The start of a transcript in ``language`` (None: the engine's own language). One
        engine serves channels of several languages; an English-only model knows only "en"."""
        if language is None or language == self.language or not self.tokenizer.multilingual:
            return self.sot_sequence
        return self.tokenizer.sot_sequence(language)

    def build_prompt(
        self, previous_tokens: list[int] | None, language: str | None = None
    ) -> tuple[list[int], int]:
        prompt: list[int] = []
        if previous_tokens:
            prompt = [self.tokenizer.special.sot_prev, *previous_tokens[-MAX_PROMPT_TOKENS:]]
        return prompt + self.sot_for(language), len(prompt)

    def detect_language(self, audio: np.ndarray, span: EncoderSpan | None = None
                        ) -> dict[str, float]:
        """Language probabilities for ≤ 30 s of audio (Whisper's own language identification)."""
        audio = audio[:WINDOW_SAMPLES]
        mel = self.features(audio)
        n_frames = min(mel.shape[-1] - 1, WINDOW_FRAMES)
        feats = self.encode(mel, (span or FULL_SPAN).frames(n_frames))
        with torch_threads(self.decoder_threads):
            return detect_language(self.model.decoder, feats, self.tokenizer)

    def decode(
        self,
        audio_features: torch.Tensor,
        previous_tokens: list[int] | None,
        options: DecodeOptions,
        prefix: tuple[int, ...] = (),
        cross_from: KVCache | None = None,
        language: str | None = None,
    ) -> DecodeResult:
        prompt, sot_index = self.build_prompt(previous_tokens, language)
        opts = replace(
            options, suppress_tokens=options.suppress_tokens or self.loaded.suppress_tokens
        )
        with torch_threads(self.decoder_threads):
            return decode_window(
                self.model.decoder, audio_features, prompt, sot_index, self.tokenizer, opts,
                prefix, cross_from,
            )

    def decode_with_fallback(
        self,
        audio_features: torch.Tensor,
        previous_tokens: list[int] | None,
        policy: FallbackPolicy = DEFAULT_POLICY,
        options: DecodeOptions = DEFAULT_OPTIONS,
        prefix: tuple[int, ...] = (),
        cross_from: KVCache | None = None,
        language: str | None = None,
    ) -> DecodeResult:
        """Greedy first; on a loop, too-compressible text or low log-prob, retry warmer (capped).
        When every temperature fails, the attempt with the best average log-probability wins,
        not the last, hottest one (espeak-ng Mandarin: greedy at -1.05 was the sentence with a
        few wrong characters, the 1.0 sample at -5.6 words of three languages)."""
        result = None
        tried: list[DecodeResult] = []
        for i, temperature in enumerate(policy.temperatures):
            opts = replace(options, temperature=temperature)
            if i > 0:
                opts = replace(
                    opts, max_new_tokens=min(opts.max_new_tokens, policy.max_fallback_tokens)
                )
            result = self.decode(
                audio_features, previous_tokens if temperature <= 0.5 else None, opts, prefix,
                cross_from, language,
            )
            if policy.silent(result) or not policy.failed(result):
                return result
            tried.append(result)
        assert result is not None
        return max(tried, key=lambda r: (
            not r.looped and r.compression_ratio <= policy.compression_ratio_threshold,
            r.avg_logprob))

    def align(
        self,
        audio_features: torch.Tensor,
        text_tokens: list[int],
        n_audio_frames: int,
        n_known_tokens: int = 0,
        cross_from: KVCache | None = None,
        language: str | None = None,
        marks_after: Sequence[tuple[float, float] | None] | None = None,
    ) -> list[WordTiming]:
        """Word timings; words of the first ``n_known_tokens`` tokens are left out. Words of
        scripts without spaces are characters (``models.words``). ``marks_after``: see
        ``align_words``."""
        with torch_threads(self.decoder_threads):
            return align_words(
                self.model.decoder,
                audio_features,
                self.tokenizer,
                self.sot_for(language),
                text_tokens,
                n_audio_frames,
                self.loaded.alignment_heads,
                n_known_tokens,
                cross_from,
                word_splitter(self.tokenizer, language or self.language),
                marks_after,
            )

    def transcribe_window(
        self,
        audio: np.ndarray,
        previous_tokens: list[int] | None = None,
        policy: FallbackPolicy = DEFAULT_POLICY,
        options: DecodeOptions = DEFAULT_OPTIONS,
        prefix: tuple[int, ...] = (),
        retry_without_prefix: Callable[[], bool] | None = None,
        span: EncoderSpan = FULL_SPAN,
        language: str | None = None,
    ) -> WindowResult:
        """Transcribe ≤ 30 s of audio; word times are relative to the window's first sample.

        ``prefix`` forces the start of the transcript (see ``decode_window``); its words were
        timed by an earlier window, so ``words`` holds only the words decoded after it. A prefix
        that ends a sentence can make Whisper end the transcript there, new speech or not: with
        ``retry_without_prefix`` (asked only when the decode added nothing to the prefix, and
        saying whether there is speech to transcribe), the decode is redone without the prefix
        (same encoder output), and ``words`` then holds every word (``prefix_used`` False).
        ``span`` says how much of the 30 s input is encoded (see ``EncoderSpan``).
        ``language``: the transcript's language (None: the engine's own)."""
        audio = audio[:WINDOW_SAMPLES]
        mel = self.features(audio)
        n_frames = min(mel.shape[-1] - 1, WINDOW_FRAMES)
        feats = self.encode(mel, span.frames(n_frames))
        cross = self.cross_cache(feats)  # shared by every decode and the alignment below
        ts = self.tokenizer.special.timestamp_begin
        n_prefix = sum(1 for t in prefix if t < ts)
        result = self.decode_with_fallback(feats, previous_tokens, policy, options, prefix, cross,
                                           language)
        if prefix and retry_without_prefix is not None and \
                len(result.text_tokens(ts)) <= n_prefix and retry_without_prefix():
            result = self.decode_with_fallback(
                feats, previous_tokens, policy, options, cross_from=cross, language=language
            )
            prefix, n_prefix = (), 0
        if policy.silent(result):
            return WindowResult(result, (), False, bool(prefix))
        text = result.text_tokens(ts)
        words = within_segments(self.align(feats, text, n_frames, n_prefix, cross, language,
                                           result.marks_after_text(ts)),
                                result.tokens, ts)
        return WindowResult(result, tuple(words), True, bool(prefix))


def _default_threads() -> int:
    return max(1, min(usable_cores(), 8))


_PROCESSES_SHARING = 1  # this process is one of N live recogniser processes (share_cores)


def share_cores(n_processes: int) -> None:
    """This process is one of ``n_processes`` live recogniser processes on the machine's
    cores: :func:`live_threads` gives it its share."""
    global _PROCESSES_SHARING
    _PROCESSES_SHARING = max(1, n_processes)


def live_threads() -> int:
    """Threads for a live recogniser: all cores but one, which stays with the tick clock, the
    tagger and the outputs, shared out among the recogniser processes (at least one each).
    Intra-op threads that must wait for a busy core stall every matrix product (measured on 2
    cores: an update took 0.60 s on 2 threads, 0.31 s on 1)."""
    return max(1, min(usable_cores() - 1, 8) // _PROCESSES_SHARING)


def quantize_linears(model: torch.nn.Module, *, inplace: bool = False) -> torch.nn.Module:
    """Dynamic int8 quantisation of the Linear layers (CPU inference only); ``inplace``: the
    given model's layers are swapped instead of a quantised copy being made.

    torch marks its quantised tensor types as deprecated; they are still the fastest int8 GEMM
    path on CPU in this release, so the warning is silenced here and nowhere else.

    A multilingual Whisper keeps its encoder in float32: with int8 activations (one scale per
    tensor) base's encoder loses Chinese (espeak-ng Mandarin: the decode ran into a loop of one
    character; decoder-only int8 gave the fp32 transcript but for 2 characters of 60).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        dims = getattr(model, "dims", None)
        if dims is not None and dims.n_vocab >= MULTILINGUAL_VOCAB:
            model = copy.copy(model)  # the caller's model stays as it was (as quantize_dynamic)
            model._modules = dict(model._modules)  # ... its own table of submodules
            model.decoder = torch.ao.quantization.quantize_dynamic(
                model.decoder, {torch.nn.Linear}, dtype=torch.qint8, inplace=inplace)
            return model
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8,
                                                      inplace=inplace)
