"""How many windows a batched engine decodes at once on CUDA: its decode buffers are allocated
for every row up front, so the rows come from the process's share of the GPU's memory
(subd.gpu.device.rows_that_fit). At the old fixed 256 rows, large-v3's buffers alone took
76 GiB a process, and large-v3-turbo's at 12 processes overran an H200 (measured there)."""

from __future__ import annotations

import pytest
import torch

from subd.bench.gpu_capacity import SIZES
from subd.config import RecognizerConfig, build_section
from subd.errors import ConfigError
from subd.gpu.device import GiB, rows_that_fit
from subd.models.batched import buffer_width, window_config
from subd.models.batched_decode import DecodeBuffers, bytes_per_row
from subd.models.whisper import Whisper, WhisperDims

TINY = WhisperDims(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6,
                   n_audio_layer=4, n_vocab=51864, n_text_ctx=448, n_text_state=384,
                   n_text_head=6, n_text_layer=4)
DIMS = {"tiny.en": TINY, **SIZES}
H200 = 139.8 * GiB


def _width(dims: WhisperDims) -> int:
    return buffer_width(window_config(dims, 1))


def _weights(dims: WhisperDims) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in Whisper(dims).parameters()) * 2  # float16


@pytest.mark.parametrize("name", sorted(DIMS))
def test_bytes_per_row_is_what_the_decode_buffers_allocate(name):
    dims = DIMS[name]
    with torch.device("meta"):
        decoder = Whisper(dims).decoder

    def allocated(rows: int) -> int:
        buf = DecodeBuffers(decoder, rows, dims.n_audio_ctx, _width(dims),
                            dtype=torch.float16, device=torch.device("meta"))
        return sum(t.nbytes for t in vars(buf).values() if isinstance(t, torch.Tensor))

    per_row = bytes_per_row(dims, torch.float16, _width(dims))
    assert allocated(3) - allocated(2) == per_row
    assert allocated(5) - allocated(1) == 4 * per_row


def test_rows_come_from_the_processes_share_of_the_gpu():
    turbo, large = SIZES["large-v3-turbo"], SIZES["large-v3"]

    def rows(dims, share_bytes, cap=256):
        return rows_that_fit(dims, torch.float16, _width(dims), _weights(dims), int(share_bytes),
                             cap)

    # large-v3-turbo on an H200: 8 processes keep the 256 rows; 12 get fewer (at 256 they
    # did not fit: CUDA out of memory in the bench)
    assert rows(turbo, H200 / 8) == 256
    assert 100 < rows(turbo, H200 / 12) < 256
    # large-v3 (320 MB a row): a 24 GiB card, one process; an H200 shared by 4
    assert 30 < rows(large, 24 * GiB) < 50
    assert 50 < rows(large, H200 / 4) < 80
    assert rows(TINY, 24 * GiB, cap=64) == 64  # never more than asked for
    with pytest.raises(ConfigError, match=r"gpu_processes: large-v3 needs 0\.3\d GiB .* fewer"):
        rows_that_fit(large, torch.float16, _width(large), _weights(large), 4 * GiB, 256,
                      "large-v3")


def test_each_batched_process_gets_its_share_of_the_gpu():
    from subd.service.sharding import batched_recogniser

    cfg = build_section("recognizer", RecognizerConfig, {"gpu_processes": 4})
    rec = batched_recogniser(cfg, cuda=True)
    assert [s.worker._spec.kwargs["share"] for s in rec.shards] == [0.25] * 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_processes_share_is_its_part_of_the_gpu_less_what_it_holds():
    from subd.gpu.device import memory_share

    torch.cuda.empty_cache()  # blocks other tests freed would take the new tensor unseen
    free, total = torch.cuda.mem_get_info()
    before = memory_share("cuda:0", 0.5)
    assert 0 < before <= min(total / 2, free)
    held = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB
    assert memory_share("cuda:0", 0.5) <= before - 255 * 2**20
    del held
