"""Our GGUF header reader and torch dequantiser against the `gguf` package: every value type, the tensor table, the
real SmolLM2 file, each quantisation type bit for bit, and the malformed files a user may hand us."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf_write import finish

from eaglespec.errors import CheckpointError
from eaglespec.loading import GGUFFile
from eaglespec.loading.gguf_header import read_header
from eaglespec.loading.gguf_quants import dequantize
from eaglespec.loading.gguf_reader import SUPPORTED_TYPES

QUANT_TYPES = tuple(Q[name] for name in SUPPORTED_TYPES)
# the types gguf.quants can only dequantize: written as random bytes
DEQUANT_ONLY = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS,
                Q.IQ3_S, Q.IQ4_NL, Q.IQ4_XS}


def _reader_values(path: Path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _write(path: Path, tensors: dict[str, tuple[np.ndarray, Q]] | None = None, alignment: int | None = None) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1.0 / 3.0)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ▁world")
    w.add_string("t.empty", "")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, 1.5])
    w.add_array("t.strs", ["a", "", "ü"])
    w.add_array("t.nested", [[1, 2], [3]])
    for name, (data, qtype) in (tensors or {}).items():
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    finish(w)


def test_metadata_of_every_value_type_equals_the_gguf_package(tmp_path):
    path = tmp_path / "kv.gguf"
    _write(path, {"a.weight": (np.ones((4, 32), np.float32), Q.F32)})
    h = read_header(path)
    assert h.version == 3
    theirs = _reader_values(path)
    assert theirs.pop("t.nested") == [1, 2, 3]  # the package flattens arrays of arrays; we keep their structure
    assert {k: v for k, v in h.metadata.items() if k != "t.nested"} == theirs
    assert h.metadata["t.str"] == "héllo ▁world" and h.metadata["t.nested"] == [[1, 2], [3]]
    assert h.metadata["t.u64"] == 2**63 + 5 and h.metadata["t.bool"] is True


@pytest.mark.parametrize("alignment", [None, 64])
def test_tensor_table_equals_the_gguf_package(tmp_path, alignment):
    rng = np.random.default_rng(0)
    tensors = {f"t{i}.weight": (rng.standard_normal(shape).astype(np.float32), qtype)
               for i, (shape, qtype) in enumerate([((3, 64), Q.Q4_1), ((7,), Q.F32), ((2, 3, 32), Q.Q8_0),
                                                   ((5, 256), Q.Q4_0)])}
    path = tmp_path / "t.gguf"
    _write(path, tensors, alignment)
    ours, theirs = read_header(path).tensors, gguf.GGUFReader(str(path)).tensors
    assert [t.name for t in ours] == [t.name for t in theirs]
    for a, b in zip(ours, theirs):
        assert a.dims == tuple(b.shape.tolist()) and a.qtype == b.tensor_type
        assert np.array_equal(a.data.reshape(-1), np.asarray(b.data).view(np.uint8).reshape(-1))
        assert a.data.shape[:-1] == tuple(reversed(a.dims[1:]))


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
def test_dequantize_is_bit_exact_with_the_gguf_package(qtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 512)) * np.array([1e-3, 0.1, 1, 10, 300, 0.0])[:, None]).astype(np.float32)
    if qtype in DEQUANT_ONLY:  # the package cannot quantise these (its numpy fallback dequantises them): any bytes
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (6, 512 // block * size), dtype=np.uint8)
    else:
        raw = gguf.quants.quantize(x, qtype)
        raw = raw.view(np.uint8).reshape(*raw.shape[:-1], -1)  # as the file holds it: bytes per row
    ours = dequantize(raw, qtype)
    theirs = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32))
    assert ours.dtype == torch.float32 and ours.shape == (6, 512)
    torch.testing.assert_close(ours, theirs.reshape(6, 512), rtol=0, atol=0, equal_nan=True)
    if qtype == Q.F32:
        assert torch.equal(ours, torch.from_numpy(x))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_0, Q.Q6_K], ids=lambda q: q.name)
def test_dequantize_in_chunks_covers_every_block(monkeypatch, qtype):
    """Tensors are dequantized a chunk of blocks at a time: chunks of 3 blocks over 7 rows of 4 blocks (28 blocks: the
    last chunk short) give every block, as gguf does."""
    from eaglespec.loading import gguf_quants

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    monkeypatch.setattr(gguf_quants, "_CHUNK_ELEMENTS", 3 * block)
    raw = np.random.default_rng(2).integers(0, 256, (7, 4 * size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    for at in {Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q6_K: (208,)}[qtype]:  # the f16 fields (d, Q4_1's m): no NaNs
        raw.reshape(7, 4, size)[..., at : at + 2] = scale
    theirs = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32))
    assert torch.equal(dequantize(raw, qtype), theirs) and theirs.shape == (7, 4 * block)


def test_real_smollm2_header_and_tensors_equal_the_gguf_package(smollm2_gguf):
    g = GGUFFile(smollm2_gguf)
    assert g.metadata == _reader_values(smollm2_gguf)
    theirs = gguf.GGUFReader(str(smollm2_gguf)).tensors
    assert [(t.name, t.dims, t.qtype) for t in g.tensors] == [(t.name, tuple(t.shape.tolist()), t.tensor_type)
                                                               for t in theirs]
    for t, r in zip(g.tensors[:3], theirs[:3]):  # the embedding (Q8_0), a norm (F32), a Q4_1 projection
        ref = np.array(gguf.quants.dequantize(r.data, r.tensor_type), dtype=np.float32)
        assert torch.equal(dequantize(t.data, t.qtype).reshape(ref.shape), torch.from_numpy(ref))


def _header_bytes(version: int = 3, endian: str = "<") -> bytes:
    return b"GGUF" + struct.pack(endian + "IQQ", version, 0, 0)


@pytest.mark.parametrize("content, reason", [
    (b"GGML" + bytes(20), "no GGUF magic"),
    (_header_bytes(version=1), "version 1 is not supported"),
    (_header_bytes(endian=">"), "big-endian"),
    (b"GGUF" + struct.pack("<I", 3), "runs past the end"),
], ids=["magic", "version", "big-endian", "cut-header"])
def test_malformed_headers_are_named(tmp_path, content, reason):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"bad.gguf is not a readable GGUF file.*{reason}"):
        GGUFFile(path)


def test_cut_metadata_and_cut_tensor_data_are_named(tmp_path):
    path = tmp_path / "full.gguf"
    _write(path, {"a.weight": (np.ones((64, 64), np.float32), Q.F32)})
    data = path.read_bytes()
    for n, reason in ((60, "runs past the end"), (len(data) - 100, "'a.weight'.s data runs past the end")):
        cut = tmp_path / f"cut{n}.gguf"
        cut.write_bytes(data[:n])
        with pytest.raises(CheckpointError, match=f"cut{n}.gguf is not a readable GGUF file.*{reason}"):
            GGUFFile(cut)
