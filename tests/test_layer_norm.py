"""LayerNorms of a half-precision model (models.whisper.layer_norms_to): in the model's dtype
where their parameters are exactly representable in it, with the float32 path's output."""

import pytest
import torch

from subd.models.whisper import LayerNorm, layer_norms_to


def _norm(weights_exact: bool) -> LayerNorm:
    torch.manual_seed(0)
    ln = LayerNorm(384)
    w, b = torch.randn(384), torch.randn(384)
    if weights_exact:  # as a float16 checkpoint's parameters are
        w, b = w.half().float(), b.half().float()
    with torch.no_grad():
        ln.weight.copy_(w)
        ln.bias.copy_(b)
    return ln


def test_parameters_move_to_half_only_where_they_are_exact():
    assert layer_norms_to(_norm(True), torch.float16).weight.dtype == torch.float16
    assert layer_norms_to(_norm(False), torch.float16).weight.dtype == torch.float32
    assert layer_norms_to(_norm(True), torch.bfloat16).weight.dtype == torch.float32


def _outputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    ln = _norm(True).to(device)
    x = (torch.randn(4, 50, 384, device=device) * 3 + 1).half()
    upcast = ln(x)  # float32 parameters: normalised on a float32 copy of x
    assert ln.weight.dtype == torch.float32
    layer_norms_to(ln, torch.float16)
    return upcast, ln(x)


def test_half_norm_matches_the_float32_path_on_the_cpu():
    upcast, direct = _outputs("cpu")
    assert direct.dtype == upcast.dtype == torch.float16
    # the CPU kernel rounds once more: within one float16 step of values up to ~8
    assert (direct.float() - upcast.float()).abs().max() <= 4e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_half_norm_is_the_float32_path_exactly_on_cuda():
    upcast, direct = _outputs("cuda")
    assert torch.equal(direct, upcast)
