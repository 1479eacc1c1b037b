"""The language a channel is transcribed in: a configured ISO code, or "auto" (identified once).

With "auto" the language is identified on the first speech of the channel, by Whisper itself
(the distribution of the token after <|startoftranscript|>), and then kept: a language that
changed from one window to the next would change the script mid-sentence. Identification waits
for ``min_speech_ms`` of speech in the window (a syllable or two is a guess) or for the window
to reach ``max_wait_ms``, whichever comes first. An English-only model knows only English.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from subd.recognise.cjk_policy import fallback_for, policy_for
from subd.script import AUTO, DEFAULT_CHINESE_SCRIPT, check_language, script_writer
from subd.types import Word


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

    ``engine``: a ``models.engine.WhisperEngine``; ``span``: the recogniser's encoder span (the
    identification sees the audio as the decodes do: on espeak-ng Mandarin, Whisper's full 30 s
    input named Thai, Japanese or English at 1-6 s of speech, the recogniser's span Chinese at
    1.5-3 s). Every update from ``min_speech_ms`` of speech on adds its language probabilities;
    the mean decides once its leader reaches ``sure_probability``, or at ``decide_speech_ms`` of
    speech, or ``max_wait_ms`` after the speech began. Until then nothing is decoded: the first
    words of an "auto" channel come that much later, once.
    """

    def __init__(self, requested: str, engine, *, span=None, min_speech_ms: int = 1000,
                 decide_speech_ms: int = 3000, max_wait_ms: int = 4000,
                 sure_probability: float = 0.5, script: str = DEFAULT_CHINESE_SCRIPT) -> None:
        self.engine = engine
        self.script = script  # Chinese: subd.script.CHINESE_SCRIPTS
        self.span = span
        # a stand-in engine (tests) may have no tokenizer: it is English-only then
        multilingual = getattr(getattr(engine, "tokenizer", None), "multilingual", False)
        self.choice = initial_choice(check_language(requested), multilingual)
        self.min_speech_ms = min_speech_ms
        self.decide_speech_ms = decide_speech_ms
        self.max_wait_ms = max_wait_ms
        self.sure_probability = sure_probability
        self._sum: dict[str, float] = {}
        self.n_identifications = 0

    @property
    def language(self) -> str | None:
        return self.choice.language

    def policy(self, config, deadline_mode: bool = False):
        """The recogniser's ``config`` as applied to this language (Chinese and Japanese commit
        by utterance, without a forced prefix: subd.recognise.cjk_policy)."""
        return policy_for(config, self.choice.language, deadline_mode)

    def fallback(self, policy, deadline_mode: bool, speech_after_commit):
        """The decode's ``policy`` (a models.engine.FallbackPolicy) as applied to this language
        (subd.recognise.cjk_policy.fallback_for)."""
        return fallback_for(policy, self.choice.language, deadline_mode, speech_after_commit)

    def written(self, words: list[Word]) -> list[Word]:
        """A decode's ``words`` in the channel's script (Chinese: ``script``)."""
        write = script_writer(self.script, self.choice.language)
        return words if write is None else [replace(w, text=write(w.text)) for w in words]

    def resolve(self, window, vad, sample_rate_hz: int = 16_000) -> str | None:
        """The language to decode ``window`` (float32 [n]) in; None: "auto" has not heard enough
        speech yet (the caller waits for more audio). ``vad`` None: decide now."""
        if self.choice.decided:
            return self.choice.language
        final = vad is None
        if not final:
            regions = vad.speech_regions(window)
            if not regions:
                return None
            speech_ms = sum(b - a for a, b in regions) * 1000 // sample_rate_hz
            waited_ms = (len(window) - regions[0][0]) * 1000 // sample_rate_hz
            if speech_ms < self.min_speech_ms and waited_ms < self.max_wait_ms:
                return None
            final = speech_ms >= self.decide_speech_ms or waited_ms >= self.max_wait_ms
        for code, p in self.engine.detect_language(window, self.span).items():
            self._sum[code] = self._sum.get(code, 0.0) + p
        self.n_identifications += 1
        mean = {code: p / self.n_identifications for code, p in self._sum.items()}
        if final or max(mean.values()) >= self.sure_probability:
            self.choice = identified(self.choice.requested, mean)
        return self.choice.language
