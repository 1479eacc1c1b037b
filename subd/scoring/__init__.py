"""Scoring what users see: word error rate with an English normaliser and punctuation F1 on
aligned words (benchmarks and tests share it).

May import: the top-level modules and ``subd.models.punct`` (its text helpers).
"""
