"""Stage processes: the process worker that runs blocking model work off the event loop, and the
hosts it runs (recogniser, tagger) with the messages they exchange.

May import: ``subd.recognise``, ``subd.punct``, ``subd.models`` (lazily, inside the worker
process) and the top-level modules. The publishing process imports this folder without
importing torch.
"""
