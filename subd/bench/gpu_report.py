"""What ``subd bench gpu --policy daemon`` reports besides its trials: WER against the same
engine offline, and the latency plot."""

from __future__ import annotations

import numpy as np


class TrialLog:
    """The bench's lines: printed as they come, and written to ``path`` too (--log)."""

    def __init__(self, path: str | None) -> None:
        self._out = open(path, "w") if path else None  # noqa: SIM115 - closed by close()

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        if self._out:
            self._out.write(line + "\n")
            self._out.flush()

    def close(self) -> None:
        if self._out:
            self._out.close()


# trials and the setup are subd.bench.gpu_policy's Trial and Setup (not imported: that module
# imports this one)
FIRST_S = 3.0  # a late word this early in its channel: the planner had measured little yet


def late_cause(word, channel_s: float, previous, previous_until_ns: int | None) -> str:
    """Why a word was committed after its tick's fetch, from the channel's previous result
    (``previous``: its tentative words; ``previous_until_ns``: that update's deadline)."""
    from subd.recognise.commit import norm_word

    if channel_s < FIRST_S:
        return "first_3s"
    if previous_until_ns is None:
        return "first_update"
    seen = [w for w in previous if norm_word(w.text) == norm_word(word.text)
            and abs(w.end_ns - word.end_ns) < 400_000_000]
    if not seen:  # Whisper had left it out, or wrote it otherwise
        return "unseen"
    # due but not committed: not heard out (its end too close to the audio end); deferred:
    # the planner expected the next result before the word's fetch, and it came after
    return "due" if seen[0].end_ns <= previous_until_ns else "deferred"

def account(trial, i: int, ok: bool, res, t_send_ns: int, t_done_ns: int, start_ns: int,
            planner, plan, shown, previous: list, d_ns: int, a_ns: int) -> None:
    """Count channel ``i``'s answer to an update sent at ``t_send_ns`` (``ok``: ``res`` is the
    host's result, else its error) into ``trial``, as a viewer of that channel would notice
    it; the channel's planner learns the round trip as the pipeline's does."""
    trial.n_updates += 1
    if trial.first_send_ns is None or t_send_ns < trial.first_send_ns:
        trial.first_send_ns = t_send_ns
    rtt = t_done_ns - t_send_ns
    trial.n_late_updates += rtt > d_ns - a_ns
    if not ok:
        trial.n_failed += 1
        why = " ".join(f"{type(res).__name__}: {res}".split())[:300]
        trial.failures[why] = trial.failures.get(why, 0) + 1
        return
    trial.n_degraded += res.degraded
    if res.degraded:
        trial.degraded_at_ns.append(t_done_ns)
    if res.decoded:  # as the scheduler: a silent window costs next to nothing
        planner.record(plan, rtt, res.duration_ns)  # its own run, the rest a wait
    trial.n_full += plan.full_span
    hyp = res.hypothesis
    if not shown[i] and (hyp.committed or hyp.tentative):
        shown[i] = True
        trial.ttfc_ms.append((t_done_ns - start_ns) / 1e6)
    for w in hyp.committed:
        lat = t_done_ns - (start_ns + w.end_ns)
        trial.n_words += 1
        trial.commit_ms.append(lat / 1e6)
        trial.visible_ms.append(max(d_ns, lat + a_ns) / 1e6)
        if lat > d_ns - a_ns:
            trial.n_late += 1
            why = late_cause(w, (t_done_ns - start_ns) / 1e9, *previous[i])
            trial.late_why[why] = trial.late_why.get(why, 0) + 1
        if i < 8:
            trial.texts.setdefault(i, []).append(w.text)
            trial.committed_ns[i] = w.end_ns
    previous[i] = (hyp.tentative, plan.commit_until_ns)


def offline_wer(engine, library: np.ndarray, trial, n_check: int = 4) -> float:
    """WER of the committed words against the same engine transcribing the same audio
    offline (the whole heard span at once, subd.recognise.offline), over a few channels: its
    words up to the channel's last committed one (those that start before that one's end;
    the words still waiting for their deadline when the trial stopped are not missing)."""
    from subd.recognise.offline import TranscribeOptions, Transcriber
    from subd.scoring.wer import normalise, wer

    tr = Transcriber(engine, TranscribeOptions())
    errs = []
    for i in range(min(n_check, trial.n_channels)):
        n = int(trial.sent[i])
        a = int(trial.offsets[i] % len(library))
        audio = np.concatenate([library, library])[a : a + n]
        until = trial.committed_ns.get(i, 0)
        ref = " ".join(w.text for seg in tr.transcribe_blocks(iter([audio]))
                       for w in seg.words if w.start_ns < until)
        hyp = " ".join(trial.texts.get(i, []))
        if ref.strip():
            errs.append(wer(normalise(ref), normalise(hyp)))
    return float(np.mean(errs)) if errs else float("nan")


def plot(path: str, best, naive, setup) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for t in (best, naive):
        if t is not None and t.visible_ms:
            v = np.sort(t.visible_ms)
            ax.plot(v / 1000, np.arange(1, len(v) + 1) / len(v),
                    label=f"{t.label}, {t.n_channels} channels")
    ax.axvline(setup.latency_ms / 1000, color="grey", linestyle=":", label="D")
    ax.set_xlabel("viewer-visible latency of a committed word (s)")
    ax.set_ylabel("fraction of words")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
