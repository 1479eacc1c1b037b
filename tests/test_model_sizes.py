"""Any Whisper size loads from a path with the tokenizer that fits its vocabulary.

The checkpoints here are built locally with random weights at a toy width (nothing can be
downloaded), but with the real vocabularies and mel-bin counts: 51864 (English-only), 51865
(multilingual tiny..large-v2), 51866 (large-v3, large-v3-turbo, distil-large-v3; 128 mel bins).
With large-v3's vocabulary every special token sits one id higher than in 51865's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from subd.errors import ModelError
from subd.models.engine import WhisperEngine
from subd.models.loading import (
    PACKAGED,
    _pinned_path,
    large_v3_tokenizer_json,
    load_model,
    tokenizer_for_vocab,
)
from subd.models.whisper import Whisper, WhisperDims


def _dims(n_vocab: int, n_mels: int, n_text_layer: int = 2) -> WhisperDims:
    return WhisperDims(n_mels=n_mels, n_audio_ctx=1500, n_audio_state=64, n_audio_head=2,
                       n_audio_layer=2, n_vocab=n_vocab, n_text_ctx=448, n_text_state=64,
                       n_text_head=2, n_text_layer=n_text_layer)


def _openai_checkpoint(tmp_path, dims: WhisperDims, name: str):
    torch.manual_seed(0)
    model = Whisper(dims)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    state = {k: v.half() for k, v in model.state_dict().items()
             if not k.endswith(("causal_mask", "decoder.output.weight"))}
    path = tmp_path / f"{name}.pt"
    torch.save({"dims": {k: getattr(dims, k) for k in dims.__dataclass_fields__},
                "model_state_dict": state}, path)
    return path


def test_large_v3_vocabulary_has_every_special_token_one_higher():
    base, _ = tokenizer_for_vocab(51865)
    v3, suppress = tokenizer_for_vocab(51866)
    b, s = base.special, v3.special
    # the published large-v3 ids
    assert (s.eot, s.sot) == (50257, 50258)
    assert (s.translate, s.transcribe, s.sot_prev, s.no_speech, s.no_timestamps) == (
        50359, 50360, 50362, 50363, 50364)
    assert s.timestamp_begin == 50365 and s.timestamp_begin + 1501 == 51866
    for name in ("translate", "transcribe", "sot_prev", "no_speech", "no_timestamps",
                 "timestamp_begin"):
        assert getattr(s, name) == getattr(b, name) + 1, name
    assert v3.sot_sequence("en") == [50258, 50259, 50360]
    assert v3.sot_sequence("yue") == [50258, 50358, 50360]
    # text tokens are unchanged, timestamps decode to the same times
    assert v3.encode(" hello world") == base.encode(" hello world")
    assert v3.token_text(50365) == "<|0.00|>" and v3.token_text(51865) == "<|30.00|>"
    # the suppress list moves with the specials: <|translate|>..<|notimestamps|> of large-v3
    assert {50359, 50360, 50361, 50362, 50363} <= set(suppress)
    assert 50358 not in suppress  # <|yue|> is a language, not suppressed


def test_v3_json_is_idempotent():
    text = _pinned_path(PACKAGED["base"].tokenizer, PACKAGED["base"].pip_name).read_text()
    once = large_v3_tokenizer_json(text)
    assert large_v3_tokenizer_json(once) == once


@pytest.mark.parametrize(("n_vocab", "n_mels", "multilingual", "ts"), [
    (51864, 80, False, 50363),   # tiny.en .. medium.en, distil-small.en
    (51865, 80, True, 50364),    # tiny .. large-v2
    (51866, 128, True, 50365),   # large-v3, large-v3-turbo, distil-large-v3
])
def test_openai_checkpoint_of_each_vocabulary_loads_and_runs(tmp_path, n_vocab, n_mels,
                                                             multilingual, ts):
    path = _openai_checkpoint(tmp_path, _dims(n_vocab, n_mels), f"toy-{n_vocab}")
    loaded = load_model(str(path))
    assert loaded.model.dims.n_mels == n_mels
    assert loaded.multilingual is multilingual
    assert loaded.tokenizer.special.timestamp_begin == ts
    engine = WhisperEngine(loaded, threads=1)
    audio = np.random.default_rng(0).standard_normal(16_000).astype(np.float32) * 0.1
    mel = engine.features(audio)
    assert mel.shape[0] == n_mels
    out = engine.transcribe_window(audio)  # random weights: any text, but it must run
    assert all(t < n_vocab for t in out.decode.tokens)


def test_turbo_shape_four_decoder_layers_loads(tmp_path):
    path = _openai_checkpoint(tmp_path, _dims(51866, 128, n_text_layer=4), "turbo-toy")
    loaded = load_model(str(path))
    assert len(loaded.model.decoder.blocks) == 4
    assert loaded.alignment_heads == tuple((layer, h) for layer in (2, 3) for h in (0, 1))


def test_safetensors_dir_with_a_tokenizer_that_does_not_fit_is_refused(tmp_path):
    from safetensors.torch import save_file

    dims = _dims(51866, 128)
    model = Whisper(dims)
    # the tokenizer is checked before the weights are fitted: one tensor is enough here
    save_file({"model.decoder.embed_tokens.weight": model.decoder.token_embedding.weight
               .detach().contiguous()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "num_mel_bins": 128, "max_source_positions": 1500, "d_model": 64,
        "encoder_attention_heads": 2, "encoder_layers": 2, "vocab_size": 51866,
        "max_target_positions": 448, "decoder_attention_heads": 2, "decoder_layers": 2}))
    base_tok = _pinned_path(PACKAGED["base"].tokenizer, PACKAGED["base"].pip_name)
    (tmp_path / "tokenizer.json").write_text(base_tok.read_text())  # 51865's: off by one
    with pytest.raises(ModelError) as err:
        load_model(str(tmp_path))
    msg = str(err.value)
    assert "does not fit" in msg and "51866" in msg and "\n" not in msg


def test_unknown_vocabulary_is_a_one_line_error(tmp_path):
    path = _openai_checkpoint(tmp_path, _dims(50000, 80), "odd")
    with pytest.raises(ModelError) as err:
        load_model(str(path))
    assert "50000" in str(err.value) and "\n" not in str(err.value)
