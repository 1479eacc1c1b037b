"""Cue layout: words into subtitle lines and cues (line length, reading speed, breaks).

May import: the top-level modules only.
"""
