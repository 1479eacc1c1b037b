"""Model code: Whisper in torch, weight loaders, the CRF tagger (installed as subd.models)."""
