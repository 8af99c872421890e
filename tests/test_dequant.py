"""Dequantizers against bit-by-bit references written here, pack round trips, and quant-config detection."""

from __future__ import annotations

import json

import pytest
import torch

from eaglespec.errors import ConfigError
from eaglespec.loading.dequant import (
    QuantSpec,
    StreamDequantizer,
    dequant_fp8_block,
    dequant_int4_pack,
    dequant_nvfp4,
    dequantize_group,
    pack_int4,
    pack_nvfp4,
    quant_spec_from_config,
    quantized_prefixes,
)

G = torch.Generator().manual_seed(0)


def _ref_int4(packed: torch.Tensor, scale: torch.Tensor, out_f: int, in_f: int, group: int) -> torch.Tensor:
    w = torch.zeros(out_f, in_f)
    for o in range(out_f):
        for j in range(in_f):
            word = int(packed[o, j // 8]) & 0xFFFFFFFF  # the int32 as its 32 unsigned bits
            nibble = (word >> (4 * (j % 8))) & 0xF
            w[o, j] = (nibble - 8) * float(scale[o, j // group])
    return w


def _fp8_e4m3_value(byte: int) -> float:
    """Decode one float8_e4m3fn byte by hand: sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, mant = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0:
        return sign * (mant / 8) * 2.0**-6
    return sign * (1 + mant / 8) * 2.0 ** (exp - 7)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _ref_nvfp4(weight: torch.Tensor, scale: torch.Tensor, scale2: float) -> torch.Tensor:
    out_f, half = weight.shape
    sbytes = scale.view(torch.uint8)
    w = torch.zeros(out_f, 2 * half, dtype=torch.float64)
    for o in range(out_f):
        for i in range(half):
            byte = int(weight[o, i])
            for j, code in ((2 * i, byte & 0xF), (2 * i + 1, byte >> 4)):  # even element in the low nibble
                v = (-1.0 if code & 8 else 1.0) * E2M1[code & 7]
                w[o, j] = v * _fp8_e4m3_value(int(sbytes[o, j // 16])) * scale2
    return w


def _random_fp8(shape: tuple[int, ...]) -> torch.Tensor:
    b = torch.randint(0, 256, shape, generator=G, dtype=torch.int32)
    b = torch.where((b & 0x7F) == 0x7F, b - 1, b)  # no NaN codes
    return b.to(torch.uint8).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("out_f,in_f,group", [(3, 64, 32), (2, 44, 32), (2, 48, 16)])
def test_int4_matches_bitwise_reference(out_f, in_f, group):
    words = -(-in_f // 8)
    packed = torch.randint(-(2**31), 2**31, (out_f, words), generator=G, dtype=torch.int64).to(torch.int32)
    scale = (torch.rand(out_f, -(-in_f // group), generator=G) + 0.1).to(torch.bfloat16)
    got = dequant_int4_pack(packed, scale, torch.tensor([out_f, in_f]), group, dtype=torch.float32)
    assert got.shape == (out_f, in_f)
    torch.testing.assert_close(got, _ref_int4(packed, scale, out_f, in_f, group), rtol=0, atol=0)
    assert dequant_int4_pack(packed, scale, (out_f, in_f), group).dtype == torch.bfloat16


def test_int4_known_word():
    # word 0x76543210 -> nibbles 0..7 (low first) -> values -8..-1; 0xFEDCBA98 -> 8..15 -> 0..7
    packed = torch.tensor([[0x76543210, 0xFEDCBA98 - 2**32]], dtype=torch.int32)
    got = dequant_int4_pack(packed, torch.tensor([[2.0]]), (1, 16), 32, dtype=torch.float32)
    assert got[0].tolist() == [2.0 * v for v in range(-8, 8)]


def test_int4_round_trip():
    w = torch.randn(8, 96, generator=G)
    q = pack_int4(w, 32)
    assert q["weight_packed"].dtype == torch.int32 and q["weight_packed"].shape == (8, 12)
    assert q["weight_scale"].shape == (8, 3) and q["weight_shape"].tolist() == [8, 96]
    back = dequant_int4_pack(q["weight_packed"], q["weight_scale"], q["weight_shape"], 32, dtype=torch.float32)
    err = (back - w).abs()
    half_scale = q["weight_scale"].float().repeat_interleave(32, 1) / 2
    assert (err <= half_scale * 1.01 + 1e-6).all()
    assert err.pow(2).mean().sqrt() / w.std() < 0.13  # 4 bits: step ~ 0.36 sigma, rms error ~ step / sqrt(12)
    torch.testing.assert_close(back, _ref_int4(q["weight_packed"], q["weight_scale"], 8, 96, 32), rtol=0, atol=0)


@pytest.mark.parametrize("out_f,in_f", [(3, 32), (2, 64)])
def test_nvfp4_matches_bitwise_reference(out_f, in_f):
    weight = torch.randint(0, 256, (out_f, in_f // 2), generator=G, dtype=torch.int32).to(torch.uint8)
    scale = _random_fp8((out_f, in_f // 16))
    scale2 = torch.tensor(0.0123)
    got = dequant_nvfp4(weight, scale, scale2, dtype=torch.float32)
    ref = _ref_nvfp4(weight, scale, float(scale2))
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=0)
    assert dequant_nvfp4(weight, scale, scale2).dtype == torch.bfloat16


def test_nvfp4_known_bytes():
    # byte 0x21: element 0 = code 1 (0.5), element 1 = code 2 (1.0); 0xF9: code 9 (-0.5), code 15 (-6)
    weight = torch.tensor([[0x21, 0xF9] + [0x60] * 6], dtype=torch.uint8)
    scale = torch.tensor([[2.0]]).to(torch.float8_e4m3fn)
    got = dequant_nvfp4(weight, scale, torch.tensor(0.5), dtype=torch.float32)
    assert got[0, :4].tolist() == [0.5, 1.0, -0.5, -6.0]
    assert got[0, 4:6].tolist() == [0.0, 4.0]  # 0x60: code 0 (0), code 6 (4)


def test_nvfp4_round_trip():
    w = torch.randn(6, 64, generator=G)
    q = pack_nvfp4(w)
    assert q["weight"].dtype == torch.uint8 and q["weight"].shape == (6, 32)
    assert q["weight_scale"].dtype == torch.float8_e4m3fn and q["weight_scale"].shape == (6, 4)
    assert q["weight_scale_2"].dim() == 0
    back = dequant_nvfp4(q["weight"], q["weight_scale"], q["weight_scale_2"], dtype=torch.float32)
    eff = (q["weight_scale"].float() * q["weight_scale_2"]).repeat_interleave(16, 1)
    assert ((back - w).abs() <= eff * 1.0 + 1e-6).all()  # the widest E2M1 gap is 2 (between 4 and 6)
    assert (back - w).pow(2).mean().sqrt() / w.std() < 0.15
    torch.testing.assert_close(
        back.double(), _ref_nvfp4(q["weight"], q["weight_scale"], float(q["weight_scale_2"])), rtol=1e-6, atol=0
    )


def test_fp8_block():
    w = torch.randn(5, 7, generator=G).to(torch.float8_e4m3fn)
    s = torch.rand(3, 4, generator=G) + 0.5
    got = dequant_fp8_block(w, s, block=2, dtype=torch.float32)
    wb = w.view(torch.uint8)
    for o in range(5):
        for i in range(7):
            assert got[o, i].item() == pytest.approx(_fp8_e4m3_value(int(wb[o, i])) * float(s[o // 2, i // 2]))


CT = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                        "strategy": "group", "group_size": 32}}
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"],
}


def test_quant_config_compressed_tensors_top_level_and_text_config():
    for cfg in ({"quantization_config": CT}, {"text_config": {"quantization_config": CT}}):
        spec = quant_spec_from_config(cfg)
        assert spec == QuantSpec("int4_pack", 32, tuple(CT["ignore"]))
        assert spec.is_ignored("language_model.lm_head")
        assert spec.is_ignored("language_model.model.layers.3.self_attn.q_a_proj")
        assert spec.is_ignored("language_model.model.layers.3.mlp.shared_experts.up_proj")
        assert spec.is_ignored("language_model.model.layers.0.mlp.gate_proj")
        assert not spec.is_ignored("language_model.model.layers.3.mlp.experts.17.gate_proj")
        assert not spec.is_ignored("language_model.model.layers.3.mlp.experts.17.down_proj")
        assert not spec.is_ignored("lm_head_extra")


def test_quant_config_modelopt_file_and_config(tmp_path):
    hf_quant = {"producer": {"name": "modelopt"},
                "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                 "exclude_modules": ["lm_head", "*self_attn*", "model.layers.0.mlp*", "*.mlp.gate"]}}
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    spec = quant_spec_from_config({"architectures": ["X"]}, tmp_path)
    assert spec.format == "nvfp4" and spec.group_size == 16
    assert spec.is_ignored("language_model.lm_head")
    assert spec.is_ignored("model.layers.5.self_attn.kv_b_proj")
    assert spec.is_ignored("model.layers.0.mlp.down_proj")
    assert spec.is_ignored("model.layers.4.mlp.gate")
    assert not spec.is_ignored("model.layers.4.mlp.experts.3.up_proj")
    assert not spec.is_ignored("model.layers.10.mlp.down_proj")
    in_config = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                         "ignore": ["re:.*vision_tower.*", "lm_head"]}}
    spec = quant_spec_from_config(in_config)
    assert spec.format == "nvfp4" and spec.is_ignored("vision_tower.encoder.blocks.0.wqkv")
    assert not spec.is_ignored("language_model.model.layers.1.mlp.experts.0.up_proj")
    # no quantization anywhere
    assert quant_spec_from_config({"architectures": ["X"]}, tmp_path / "missing") is None
    fp8 = quant_spec_from_config({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    assert fp8 == QuantSpec("fp8_block", 128, ())


def test_quant_config_unsupported_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="gptq"):
        quant_spec_from_config({"quantization_config": {"quant_method": "gptq"}})
    bad = dict(CT, format="float-quantized")
    with pytest.raises(ConfigError, match="float-quantized"):
        quant_spec_from_config({"quantization_config": bad})
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    with pytest.raises(ConfigError, match="FP8"):
        quant_spec_from_config({}, tmp_path)


def test_groups_and_dequantize_group():
    w1, w2 = torch.randn(4, 64, generator=G), torch.randn(4, 32, generator=G)
    p = "model.layers.1.mlp.experts.0.up_proj"
    q = "model.layers.1.mlp.experts.1.up_proj"
    state = {f"{p}.{k}": v for k, v in pack_int4(w1).items()}
    state.update({f"{q}.{k}": v for k, v in pack_nvfp4(w2).items()})
    state["model.layers.1.self_attn.o_proj.weight"] = torch.randn(4, 4)
    groups = quantized_prefixes(state)
    assert set(groups) == {p, q}
    assert sorted(groups[q]) == sorted(f"{q}.{s}" for s in ("weight", "weight_scale", "weight_scale_2", "input_scale"))
    a = dequantize_group(p, {n: state[n] for n in groups[p]}, dtype=torch.float32)  # full names, inferred group
    b = dequantize_group(p, {n.rsplit(".", 1)[1]: state[n] for n in groups[p]}, QuantSpec("int4_pack", 32))  # suffixes
    torch.testing.assert_close(a, dequant_int4_pack(state[f"{p}.weight_packed"], state[f"{p}.weight_scale"],
                                                    (4, 64), 32, torch.float32), rtol=0, atol=0)
    assert b.dtype == torch.bfloat16 and torch.equal(b, a.to(torch.bfloat16))
    c = dequantize_group(q, {n: state[n] for n in groups[q]}, dtype=torch.float32)
    torch.testing.assert_close(c, dequant_nvfp4(state[f"{q}.weight"], state[f"{q}.weight_scale"],
                                                state[f"{q}.weight_scale_2"], 16, torch.float32), rtol=0, atol=0)
    assert (c - w2).abs().max() < 0.5 * w2.abs().max()
    plain = dequantize_group("x", {"x.weight": torch.ones(2, 2)})
    assert plain.dtype == torch.bfloat16


def test_stream_dequantizer_any_order():
    w_int4, w_fp4 = torch.randn(4, 64, generator=G), torch.randn(4, 32, generator=G)
    fp8_w = torch.randn(4, 8, generator=G).to(torch.float8_e4m3fn)
    fp8_s = torch.tensor([[0.5]])
    stream = [(f"a.{k}", v) for k, v in pack_int4(w_int4).items()]
    stream += [(f"b.{k}", v) for k, v in pack_nvfp4(w_fp4).items()]
    stream += [("c.weight", fp8_w), ("c.weight_scale_inv", fp8_s), ("norm.weight", torch.ones(4))]
    order = torch.randperm(len(stream), generator=G).tolist()
    hook = StreamDequantizer(dtype=torch.float32)
    out = dict(item for i in order for item in hook(*stream[i]))
    assert set(out) == {"a.weight", "b.weight", "c.weight", "norm.weight"} and hook.pending() == []
    torch.testing.assert_close(out["a.weight"], dequantize_group("a", dict(stream[:3]), dtype=torch.float32))
    torch.testing.assert_close(out["b.weight"], dequantize_group("b", dict(stream[3:7]), dtype=torch.float32))
    torch.testing.assert_close(out["c.weight"], fp8_w.float() * 0.5)
    assert torch.equal(out["norm.weight"], torch.ones(4))
    assert (out["a.weight"] - w_int4).abs().max() < 0.5 and (out["b.weight"] - w_fp4).abs().max() < 1.0
    # an incomplete group yields nothing and is reported
    hook = StreamDequantizer()
    assert hook("d.weight_packed", stream[0][1]) == [] and hook("d.weight_scale", stream[1][1]) == []
    assert sorted(hook.pending()) == ["d.weight_packed", "d.weight_scale"]
