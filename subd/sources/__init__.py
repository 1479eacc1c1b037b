"""Audio in: files (libsndfile or ffmpeg, one decoder for the daemon and ``subd transcribe``),
raw PCM, microphone, HTTP push, and the drift estimate of live sample clocks.

May import: the top-level modules only (types, errors, clock).
"""
