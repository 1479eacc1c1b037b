"""ONNX export of the encoder and the batched decoder step, run by onnxruntime on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from subd.models.export_onnx import DecoderStep, example_inputs, export  # noqa: E402


@pytest.fixture(scope="module")
def exported(engine, tmp_path_factory):
    model = engine.model
    return model, export(model, tmp_path_factory.mktemp("onnx"))


def _session(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("batch", "frames"), [(1, 3000), (3, 1000)])
def test_encoder_onnx_matches_torch_for_any_batch_and_length(exported, speech_clips, engine,
                                                             batch, frames):
    model, (enc_path, _) = exported
    from subd.kernels.mel import log_mel, pad_or_trim_frames
    from subd.sources.decode import load_audio

    mels = [pad_or_trim_frames(log_mel(load_audio(c.path)), frames) for c in speech_clips[:batch]]
    mel = torch.stack(mels)
    with torch.inference_mode():
        ref = model.encoder(mel).numpy()
    got = _session(enc_path).run(None, {"mel": mel.numpy()})[0]
    assert got.shape == ref.shape == (batch, frames // 2, model.dims.n_audio_state)
    assert np.abs(got - ref).max() < 2e-3


def test_decoder_step_onnx_matches_the_torch_step(exported):
    model, (_, dec_path) = exported
    sess = _session(dec_path)
    for batch, ctx, n_audio in ((2, 64, 500), (5, 128, 1500)):
        inputs = example_inputs(model, batch, ctx, n_audio)
        with torch.inference_mode():
            ref = DecoderStep(model.decoder)(*inputs)
        names = ["tokens", "positions", "self_k", "self_v", "cross_k", "cross_v"]
        got = sess.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})
        assert got[0].shape == (batch, model.dims.n_vocab)
        assert np.abs(got[0] - ref[0].numpy()).max() < 2e-3
        assert (got[0].argmax(-1) == ref[0].numpy().argmax(-1)).all()
        # each row's new key lands at its own position, and nowhere else
        changed = np.abs(got[1] - inputs[2].numpy()).max(axis=(0, 2, 4)) > 0  # [batch, ctx]
        for b in range(batch):
            assert changed[b].nonzero()[0].tolist() == [int(inputs[1][b])]


def test_decoder_step_agrees_with_the_engine_decoder(engine):
    """The exported step function gives the engine decoder's next-token logits."""
    model = engine.model
    d = model.dims
    audio = torch.randn(1, 200, d.n_audio_state)
    prompt = engine.sot_sequence
    with torch.inference_mode():
        cache = model.decoder.new_cache(audio)
        ref, _ = model.decoder(torch.tensor([prompt + [440]]), cache)
        cache2 = model.decoder.new_cache(audio)
        model.decoder(torch.tensor([prompt]), cache2)
        logits, _, _ = DecoderStep(model.decoder)(
            torch.tensor([440]), torch.tensor([len(prompt)]), cache2.self_k, cache2.self_v,
            cache2.cross_k, cache2.cross_v)
    assert torch.allclose(logits[0], ref[0, -1], atol=1e-3)
