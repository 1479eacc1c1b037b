"""Punctuation, capitals and subtitle-break preferences on the word stream (the CRF tagger in
``subd.models.punct``, streamed).

May import: ``subd.models.punct`` and the top-level modules.
"""
