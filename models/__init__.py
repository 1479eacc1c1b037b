"""Model code: Whisper in torch, weight loaders, the CRF tagger (installed as subd.models).

May import: ``subd.kernels`` and the top-level modules of ``subd`` (errors, types,
torch_threads); never the daemon's folders (pipeline, service, sinks, ...).
"""
