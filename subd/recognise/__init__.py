"""Speech recognition over the Whisper engine: the streaming commit policy, voice activity
detection and offline transcription.

May import: ``subd.models``, ``subd.kernels`` and the top-level modules.
"""
