"""How the streaming recogniser commits Chinese and Japanese: by utterance, from a free decode.

In Chinese every character is a word of the hypothesis (models.words), and a character is often
a near-tie that its neighbours decide (停滞 / 停制, 虽然 / 孙然): Whisper reads it right once it has
heard the whole phrase and is free to write the phrase anew. The English policy commits a word
by agreement 150 ms after it ends and forces the committed words as the next decode's prefix; on
Chinese that settles each character from a decode of part of its phrase, and every later decode
must continue the characters already chosen.

So for the languages of ``UTTERANCE_LANGUAGES`` the recogniser
* commits by agreement only after ``AGREE_GUARD_MS`` of audio after a character, and holds a
  character at most ``MAX_TENTATIVE_MS``: in practice the tail commits at the pause that ends
  its utterance (``pause_commit_ms``), from a decode that heard all of it (see below);
* does not force the committed characters inside the window as the decode's prefix: each decode
  reads the window's audio freely, and the characters that re-state committed audio are dropped
  (readings.after_commit_point), as for a decode without a prefix; so when the window moves on
  it starts at a pause, the start of an utterance, not inside one (streaming._trim,
  settle.utterance_start: D = 4 s, 4-5 characters of 177 / 276 fewer wrong);
* driven alone, commits an utterance at its pause only once the decode has heard
  ``UTTERANCE_CONTEXT_MS`` of the speech that follows the pause (``pause_context_ms``): the pause
  alone does not commit it. A speaker who stops is committed by agreement after
  ``AGREE_GUARD_MS``, or at the stream's end.

Neither change alone moved the figures; together, measured with the recogniser driven alone
(agreement, base int8, mean character errors over 6 runs: update steps 0.4/0.5/0.6 s, 0 or
0.3 s of silence first): 3 AISHELL-1 clips (38 characters) 6.8 -> 4.8 (subd transcribe: 2 or 4,
by where the audio starts), and a held-out set never tuned on (3 WenetSpeech/AISHELL-2 clips
from FireRedASR's examples, 76 characters) 26.7 -> 19.0 (transcribe 17). On espeak-ng's robotic
voice it costs characters (100 characters: 62 -> 67; a held-out 114: 60 -> 67; transcribe 53
and 60): read in one voice with no pauses between sentences, it had gained from the prefix.
The held-out clips are not in the repository (AISHELL-2 and WenetSpeech are licensed for
research only). In deadline mode (the daemon) words commit at their deadline as before, and two
things change: the prefix, and a due character counts as heard out only ``DEADLINE_GUARD_MS``
before the audio end (English: ``agree_guard_ms``, 150 ms, which only keeps a word cut short at
the end out). A character decided from a decode that heard less than two characters after it is
read from part of its phrase; it waits for the next update. Where the planner's deadline is
right that costs the character one update of lateness; where the deadline was a guess (the
stream's first update on the cut span: its cost unmeasured, the planner takes the full input's
1.35 s for it, and every character heard would be due) the next update is in long before the
character's deadline. espeak-ng on the daemon's path (D = 2 s): CER 0.680 -> 0.640, characters
late 7 -> 5 ("在这中对摩的山木中" was decided 0.2 s after its end); AISHELL 0.079 in all six runs
either way, held-out espeak-ng 0.614 either way (late 13 -> 9), and at D = 1 s with updates of
0.3 / 0.15 s AISHELL is unchanged, late characters too (docs/MEASUREMENTS.md, Languages). The rest
is set by how much right context the planner leaves a character, not by this policy
(tests/test_mandarin.py, test_daemon_path_*): moving the window to the start of the utterance and
leaving out early commits by agreement were measured and made it worse. English and other languages
keep the configured policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import TypeVar

UTTERANCE_LANGUAGES = frozenset({"zh", "yue", "ja"})
AGREE_GUARD_MS = 5000
MAX_TENTATIVE_MS = 8000
# deadline mode: audio heard after a due character before it is decided (two characters at
# ~4 a second); 800 ms gave the same text on espeak-ng, and leaves less room at shorter D
DEADLINE_GUARD_MS = 500

# Driven alone: speech heard after the pause that ends an utterance before the pause commits it.
# Traced on AISHELL on an AVX2 CPU (issue 20's run failing at 0.132): every decode of the
# stream from 7 s to the pause after "一二线城市虽然也处于调整中" read 尝试孙然, and the pause
# committed it. Decoded apart, windows ending in that pause (9.0-10.0 s; from 0, 3.56 or 4.4 s,
# cut span or full input, with or without the first utterance as prompt) read 城市虽然 in 3 of
# 30, and 8 of 10 that also heard the next utterance (to 14.1 s), as offline does; in the
# stream, a decode that had heard 0.6 s of it still read 尝试孙然, from 1.1 s on 城市虽然.
# Mean character errors over 6 runs (update steps 0.4/0.5/0.6 s, 0 or 0.3 s of silence first),
# pause alone -> 1 s of speech after it: AISHELL 3.8 -> 2.0 of 38 (transcribe 2), zh-dev 6.2 ->
# 4.5 of 49 (transcribe 4); held out, never tuned on: zh-heldout 1.5 -> 3.0 of 39 (transcribe 3:
# its last utterance has no speech after it and is now read at the stream's end on Whisper's
# full input, as offline reads it, 达摩院 -> 打模样; the cut span at the pause had read 达摩院 in
# 3 runs of 6), espeak-ng 58.2 of 100 either way (the same text in each run; transcribe 50 and
# 63). 500 ms: AISHELL 2.0 as well. Deadline mode (the daemon) is not affected.
UTTERANCE_CONTEXT_MS = 1000

C = TypeVar("C")
P = TypeVar("P")


@lru_cache(maxsize=16)  # asked at every update; a config is frozen, so hashable
def policy_for(config: C, language: str | None, deadline_mode: bool = False) -> C:
    """``config`` (a StreamingConfig) as the recogniser applies it to ``language``. In
    deadline mode the guard also says when a due word is heard out: ``DEADLINE_GUARD_MS``, not
    5 s (a character waiting 5 s would miss its deadline); early commits there need
    ``agree_context_ms`` anyway."""
    if language not in UTTERANCE_LANGUAGES:
        return config
    if deadline_mode:
        return replace(config, force_committed_prefix=False,
                       agree_guard_ms=max(config.agree_guard_ms, DEADLINE_GUARD_MS))
    return replace(config, agree_guard_ms=max(config.agree_guard_ms, AGREE_GUARD_MS),
                   max_tentative_ms=max(config.max_tentative_ms, MAX_TENTATIVE_MS),
                   pause_context_ms=max(config.pause_context_ms, UTTERANCE_CONTEXT_MS),
                   force_committed_prefix=False)


def fallback_for(policy: P, language: str | None, deadline_mode: bool,
                 speech_after_commit: Callable[[], bool]) -> P:
    """``policy`` (a models.engine.FallbackPolicy) as a decode of ``language`` applies it.

    In deadline mode a Chinese or Japanese decode is greedy, and where the voice-activity
    detector heard speech after the commit point, Whisper's no-speech rule (no-speech
    probability over 0.6 and mean log-probability under -1) does not drop it. On a cut window
    of unclear speech base's no-speech probability reached 0.61-0.77 (espeak-ng, the daemon's
    path, 3 decodes of 79 in mid-sentence): the decode was dropped as silence, the recogniser
    took that for a stall (subd.recognise.streaming._trim), moved the window to 0.2 s before the
    commit point, in mid-word, and decoded it again at temperature 0.6. What came out was
    English or a sentence of other characters ("猫, 你 can't poop", "Q Watcha"), and the
    characters due were committed from it. Greedy: the temperature fallback was measured worse
    for Chinese before (module docstring). ``speech_after_commit`` is asked only for these
    languages in deadline mode. The daemon's path at D = 2 s (--update-ms 1350,400), runs 0,
    150 and 300 ms of silence later: espeak-ng's 5 sentences 72, 67, 65 -> 68, 67, 64 characters
    wrong of 100 (offline 50; the rule fired in the first and the last run); zh-dev 5, 7, 5 and
    zh-heldout unchanged. Most of espeak-ng's gap to offline (17 points) lies elsewhere:
    consecutive decodes of that voice read the same audio differently, and the characters due
    at each deadline come from whichever reading was last.
    """
    if language not in UTTERANCE_LANGUAGES or not deadline_mode:
        return policy
    greedy = replace(policy, temperatures=policy.temperatures[:1])
    return replace(greedy, no_speech_threshold=1.0) if speech_after_commit() else greedy

