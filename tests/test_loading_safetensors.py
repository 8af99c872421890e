"""Safetensors reading and writing: single files, shards with an index, lazy iteration, and corrupt files."""

from __future__ import annotations

import inspect
import json
import struct
from pathlib import Path

import pytest
import torch

from eaglespec.errors import CheckpointError
from eaglespec.loading.safetensors_io import (
    INDEX_NAME,
    check_safetensors_header,
    iter_safetensors,
    load_safetensors,
    safetensors_files,
    save_safetensors,
    save_safetensors_sharded,
)


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(8, 4, generator=g),
        "b.weight": torch.randn(16, generator=g).to(torch.bfloat16),
        "c.ids": torch.arange(10, dtype=torch.int64),
        "d.weight": torch.randn(3, 5, generator=g).t(),  # not contiguous
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_single_file_round_trip(tmp_path):
    t = sample_tensors()
    save_safetensors(t, tmp_path / "model.safetensors", {"note": "x"})
    assert safetensors_files(tmp_path) == [tmp_path / "model.safetensors"]
    assert_same(load_safetensors(tmp_path), t)
    assert_same(load_safetensors(tmp_path / "model.safetensors"), t)
    assert check_safetensors_header(tmp_path / "model.safetensors")["__metadata__"] == {"format": "pt", "note": "x"}


def test_sharded_with_index_loads_like_single_file(tmp_path):
    t = sample_tensors()
    save_safetensors(t, tmp_path / "single" / "model.safetensors")
    shards = save_safetensors_sharded(t, tmp_path / "sharded", max_shard_bytes=100)
    assert len(shards) >= 3
    index = json.loads((tmp_path / "sharded" / INDEX_NAME).read_text())
    assert sorted(index["weight_map"]) == sorted(t)
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    assert_same(load_safetensors(tmp_path / "sharded"), load_safetensors(tmp_path / "single"))


def test_shards_without_index_are_all_read(tmp_path):
    t = sample_tensors()
    save_safetensors({k: v for k, v in t.items() if k < "c"}, tmp_path / "part-a.safetensors")
    save_safetensors({k: v for k, v in t.items() if k >= "c"}, tmp_path / "part-b.safetensors")
    assert_same(load_safetensors(tmp_path), t)


def test_iteration_is_lazy(tmp_path):
    save_safetensors(sample_tensors(), tmp_path / "model.safetensors")
    it = iter_safetensors(tmp_path)
    assert inspect.isgenerator(it)
    name, tensor = next(it)
    assert isinstance(name, str) and isinstance(tensor, torch.Tensor)
    it.close()


def test_tied_tensors_are_written_once_each(tmp_path):
    w = torch.randn(6, 3)
    save_safetensors({"embed.weight": w, "head.weight": w}, tmp_path / "m.safetensors")
    out = load_safetensors(tmp_path / "m.safetensors")
    assert torch.equal(out["embed.weight"], w) and torch.equal(out["head.weight"], w)


def test_missing_paths(tmp_path):
    with pytest.raises(CheckpointError, match="nowhere does not exist"):
        load_safetensors(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        load_safetensors(tmp_path)
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="model-00001-of-00002.safetensors does not exist"):
        load_safetensors(tmp_path)
    (tmp_path / INDEX_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid safetensors index"):
        load_safetensors(tmp_path)


def test_index_naming_a_tensor_its_shard_lacks(tmp_path):
    save_safetensors({"a": torch.zeros(2)}, tmp_path / "s1.safetensors")
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}}))
    with pytest.raises(CheckpointError, match="lists 'b' in s1.safetensors"):
        load_safetensors(tmp_path)


def _header_file(path: Path, header: dict | bytes, data: bytes) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize(
    "case, expected",
    [
        ("garbage", "header claims"),
        ("tiny", "shorter than the 8-byte"),
        ("truncated", "but the data section has only"),
        ("bad_json", "header is not valid JSON"),
        ("not_object", "not a JSON object"),
        ("offsets_outside", "lies at bytes 0..4000"),
        ("size_mismatch", "should take 128 bytes"),
        ("malformed_entry", "entry of tensor 'x' is malformed"),
    ],
)
def test_corrupt_files_name_the_file(tmp_path, case, expected):
    good = save_safetensors(sample_tensors(), tmp_path / "good.safetensors")
    bad = tmp_path / "model.safetensors"
    if case == "garbage":
        bad.write_bytes(b"\xff" * 64)
    elif case == "tiny":
        bad.write_bytes(b"\x01\x02")
    elif case == "truncated":
        bad.write_bytes(good.read_bytes()[:-40])
    elif case == "bad_json":
        _header_file(bad, b"{this is not json", b"")
    elif case == "not_object":
        _header_file(bad, b"[1, 2, 3]", b"")
    elif case == "offsets_outside":
        _header_file(bad, {"x": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}, b"\0" * 16)
    elif case == "size_mismatch":
        _header_file(bad, {"x": {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 16]}}, b"\0" * 16)
    elif case == "malformed_entry":
        _header_file(bad, {"x": {"dtype": "F32"}}, b"")
    good.unlink()
    with pytest.raises(CheckpointError) as e:
        list(iter_safetensors(tmp_path))
    assert str(bad) in str(e.value) and expected in str(e.value)
