"""The language a channel is transcribed in: a configured ISO code, or "auto" (identified once).

With "auto" the language is identified on the first speech of the channel, by Whisper itself
(the distribution of the token after <|startoftranscript|>), and then kept: a language that
changed from one window to the next would change the script mid-sentence. Identification waits
for ``min_speech_ms`` of speech in the window (a syllable or two is a guess) or for the window
to reach ``max_wait_ms``, whichever comes first. An English-only model knows only English.
"""

from __future__ import annotations

from dataclasses import dataclass

from subd.script import AUTO, check_language


@dataclass(frozen=True, slots=True)
class LanguageChoice:
    """What a channel was asked for, and what it is transcribed in."""

    requested: str  # "auto" or a code
    language: str | None  # None while "auto" has not heard enough speech yet
    probability: float = 1.0  # Whisper's probability for the identified language

    @property
    def decided(self) -> bool:
        return self.language is not None


def initial_choice(requested: str, multilingual: bool) -> LanguageChoice:
    if requested == AUTO and multilingual:
        return LanguageChoice(AUTO, None, 0.0)
    return LanguageChoice(requested, "en" if requested == AUTO else requested)


def identified(requested: str, probabilities: dict[str, float]) -> LanguageChoice:
    code, p = max(probabilities.items(), key=lambda kv: kv[1])
    return LanguageChoice(requested, code, p)


class LanguageTracker:
    """A channel's language over a streaming recogniser: fixed, or identified on first speech.

    ``engine``: a ``models.engine.WhisperEngine``; ``vad``: a voice-activity detector or None.
    """

    def __init__(self, requested: str, engine, *, min_speech_ms: int = 1000,
                 max_wait_ms: int = 3000) -> None:
        self.engine = engine
        self.choice = initial_choice(check_language(requested), engine.tokenizer.multilingual)
        self.min_speech_ms = min_speech_ms
        self.max_wait_ms = max_wait_ms

    @property
    def language(self) -> str | None:
        return self.choice.language

    def resolve(self, window, vad, sample_rate_hz: int = 16_000) -> str | None:
        """The language to decode ``window`` (float32 [n]) in; None: "auto" has not heard enough
        speech yet (the caller waits for more audio)."""
        if self.choice.decided:
            return self.choice.language
        if vad is not None:
            regions = vad.speech_regions(window)
            speech_ms = sum(b - a for a, b in regions) * 1000 // sample_rate_hz
            if not regions:
                return None
            waited_ms = (len(window) - regions[0][0]) * 1000 // sample_rate_hz
            if speech_ms < self.min_speech_ms and waited_ms < self.max_wait_ms:
                return None
        self.choice = identified(self.choice.requested, self.engine.detect_language(window))
        return self.choice.language
