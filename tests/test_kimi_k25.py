"""Kimi-K2.5 end to end on tiny checkpoints written here with the release's tensor names: bf16, INT4 routed experts
(compressed-tensors pack-quantized) and NVFP4 (ModelOpt, `language_model.layers.` names), each with a tiny tiktoken
tokenizer. Loading through the registry, dequantized logits vs the same weights stored plain, parity with
transformers' Kimi-K2.5, image placeholders, greedy speculative == plain greedy (text and images), the protocol check,
and the CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_kimi_tokenizer import write_tiny_tokenizer
from tiny import tiny_drafter

from eaglespec.cli import main
from eaglespec.config import EngineConfig, ModelConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import ProtocolError, RequestError
from eaglespec.layers.context import ForwardContext
from eaglespec.loading.checkpoint import load_model
from eaglespec.loading.dequant import dequant_int4_pack, dequant_nvfp4, pack_int4, pack_nvfp4, quant_spec_from_config
from eaglespec.loading.safetensors_io import save_safetensors
from eaglespec.loading.tiktoken_tokenizer import TiktokenTokenizer
from eaglespec.models.kimi_k25 import KimiK25ForConditionalGeneration
from eaglespec.protocol import ENGINE_METHODS, PROTOCOL_METHODS, check_target
from eaglespec.sampling_params import SamplingParams

TEXT_LAYERS = 4
EXPERT = re.compile(r"^language_model\.model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
INT4_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
               "re:.*vision_tower.*", "re:.*mm_projector.*"],
}
NVFP4_CONFIG = {
    "producer": {"name": "modelopt", "version": "0.0.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                     "exclude_modules": ["lm_head", "*self_attn*", "*shared_experts*", "language_model.layers.0.mlp*",
                                         "*mlp.gate", "vision_tower*", "mm_projector*"]},
}


def tiny_config(vocab: int) -> dict:
    """A Kimi-K2.5 config.json at tiny sizes: MLA + MoE text model with a dense first layer, YaRN as the release,
    vision keys under both spellings (release `vt_*` / `init_pos_emb_*` and transformers' canonical names)."""
    n = vocab - 256  # first special id
    text = dict(
        model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"], vocab_size=vocab, hidden_size=64,
        intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=TEXT_LAYERS, num_attention_heads=4,
        num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, moe_layer_freq=1, routed_scaling_factor=2.827, norm_topk_prob=True,
        scoring_func="sigmoid", topk_method="noaux_tc", q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
        qk_rope_head_dim=8, v_head_dim=10, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
        max_position_embeddings=4096, num_nextn_predict_layers=1, rope_theta=50000.0,
        rope_scaling=dict(type="yarn", factor=64.0, original_max_position_embeddings=64, beta_fast=32.0,
                          beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
        bos_token_id=n, eos_token_id=n + 1, pad_token_id=n + 255,
    )
    vision = dict(
        patch_size=14, init_pos_emb_height=8, init_pos_emb_width=8, init_pos_emb_time=4, pos_emb_type="divided_fixed",
        vt_num_attention_heads=4, vt_num_hidden_layers=2, vt_hidden_size=32, vt_intermediate_size=48,
        num_attention_heads=4, num_hidden_layers=2, hidden_size=32, intermediate_size=48, pos_emb_height=8,
        pos_emb_width=8, pos_emb_time=4, merge_kernel_size=[2, 2], video_attn_type="spatial_temporal",
        merge_type="sd2_tpool", mm_projector_type="patchmerger", mm_hidden_size=32, projector_hidden_act="gelu",
        projector_ln_eps=1e-5, text_hidden_size=64,
    )
    return dict(
        architectures=["KimiK25ForConditionalGeneration"], model_type="kimi_k25", text_config=text,
        vision_config=vision, media_placeholder_token_id=n + 21, image_token_id=n + 21, projection_hidden_size=32,
        projection_layer_norm_eps=1e-5, pad_token_id=n + 255, bos_token_id=n, eos_token_id=n + 1,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )


def random_state(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """The release's tensors at random values of O(1) activations, rounded to bf16 (bias kept fp32), plus an MTP
    layer the loader must ignore."""
    with torch.device("meta"):
        model = KimiK25ForConditionalGeneration(ModelConfig.from_hf(config))
    shapes = {k: t.shape for k, t in model.state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in shapes.items():
        if name.endswith("e_score_correction_bias"):
            sd[name] = 0.1 * torch.randn(shape, generator=g)
            continue
        if len(shape) == 1:
            v = (1.0 if "norm" in name else 0.0) + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("pos_emb.weight"):
            v = 0.5 * torch.randn(shape, generator=g)
        else:
            v = torch.randn(shape, generator=g) / math.sqrt(math.prod(shape[1:]))
        sd[name] = v.to(torch.bfloat16)
    mtp = f"language_model.model.layers.{TEXT_LAYERS}"
    sd[f"{mtp}.eh_proj.weight"] = torch.zeros(64, 128, dtype=torch.bfloat16)
    sd[f"{mtp}.enorm.weight"] = torch.ones(64, dtype=torch.bfloat16)
    return sd


def write_folder(folder: Path, config: dict, state: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_safetensors(state, folder / "model.safetensors")
    return folder


def quantized_states(state: dict[str, torch.Tensor], fmt: str) -> tuple[dict, dict]:
    """(checkpoint with quantized routed experts, the same weights dequantized and stored plain in float32)."""
    quant, plain = {}, {}
    for name, t in state.items():
        if not EXPERT.match(name):
            quant[name] = plain[name] = t
            continue
        prefix = name.removesuffix(".weight")
        if fmt == "int4":
            pieces = pack_int4(t.float(), group_size=32)
            plain[name] = dequant_int4_pack(pieces["weight_packed"], pieces["weight_scale"], pieces["weight_shape"],
                                            32, torch.float32)
        else:
            pieces = pack_nvfp4(t.float())
            plain[name] = dequant_nvfp4(pieces["weight"], pieces["weight_scale"], pieces["weight_scale_2"], 16,
                                        torch.float32)
        quant.update({f"{prefix}.{k}": v for k, v in pieces.items()})
    if fmt == "nvfp4":  # the NVFP4 release names the layers without `model.`
        quant = {k.replace("language_model.model.layers.", "language_model.layers."): v for k, v in quant.items()}
    return quant, plain


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kimi")
    vocab = write_tiny_tokenizer(root / "tok").vocab_size
    config = tiny_config(vocab)
    state = random_state(config)
    out = {"bf16": write_folder(root / "bf16", config, state)}
    q, plain = quantized_states(state, "int4")
    cfg_int4 = json.loads(json.dumps(config))
    cfg_int4["text_config"]["quantization_config"] = INT4_CONFIG
    out["int4"] = write_folder(root / "int4", cfg_int4, q)
    out["int4_plain"] = write_folder(root / "int4_plain", config, plain)
    q, plain = quantized_states(state, "nvfp4")
    out["nvfp4"] = write_folder(root / "nvfp4", config, q)
    (out["nvfp4"] / "hf_quant_config.json").write_text(json.dumps(NVFP4_CONFIG))
    out["nvfp4_plain"] = write_folder(root / "nvfp4_plain", config, plain)
    return out


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


_LOADED: dict[str, object] = {}


def loaded(folders, which: str):
    if which not in _LOADED:
        _LOADED[which] = load_model(folders[which])
    return _LOADED[which]


def synthetic_image(seed: int, size: tuple[int, int] = (90, 60)) -> Image.Image:
    """A smooth gradient plus noise: w x h = 90 x 60 pads to 112 x 84 -> a 6 x 8 patch grid -> 12 image tokens."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (w + h)], -1)
    return Image.fromarray(np.clip(base + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8))


def logits_of(model, ids: list[int], mm) -> torch.Tensor:
    x = torch.tensor(ids)[None]
    with torch.inference_mode():
        emb = model.embed_multimodal(x, [mm])
        return model(None, ForwardContext.plain(1, x.shape[1]), inputs_embeds=emb).logits


# --- loading ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["bf16", "int4", "nvfp4"])
def test_loads_through_the_registry(folders, which):
    lm = loaded(folders, which)
    assert isinstance(lm.model, KimiK25ForConditionalGeneration)
    assert isinstance(lm.tokenizer, TiktokenTokenizer)
    report = check_target(lm.model)
    assert report.ok and report.delegated_via == "language_model"
    m = lm.model
    assert m.get_embed_and_head()[0] is m.language_model.model.embed_tokens.weight
    assert m.kv_cache_shapes() == [(16 + 8,)]  # MLA latent + rope key
    assert not any(t.is_meta for t in m.state_dict().values())
    assert [type(layer.mlp).__name__ for layer in m.language_model.model.layers] == ["GatedMLP"] + ["MoE"] * 3


def test_quant_configs_are_detected_with_their_ignore_lists(folders):
    cfg = json.loads((folders["int4"] / "config.json").read_text())
    spec = quant_spec_from_config(cfg, folders["int4"])
    assert spec.format == "int4_pack" and spec.group_size == 32
    nv = quant_spec_from_config(json.loads((folders["nvfp4"] / "config.json").read_text()), folders["nvfp4"])
    assert nv.format == "nvfp4" and nv.group_size == 16
    for s, layers in ((spec, "language_model.model.layers"), (nv, "language_model.layers")):
        assert not s.is_ignored(f"{layers}.2.mlp.experts.5.down_proj")
        for module in (f"{layers}.2.self_attn.kv_b_proj", f"{layers}.2.mlp.shared_experts.up_proj",
                       f"{layers}.0.mlp.gate_proj", "language_model.lm_head", "vision_tower.encoder.blocks.0.wqkv",
                       "mm_projector.proj.0"):
            assert s.is_ignored(module), (s.format, module)


@pytest.mark.parametrize("fmt", ["int4", "nvfp4"])
def test_dequantized_logits_match_plain_weights(folders, fmt):
    q, ref = loaded(folders, fmt).model, loaded(folders, f"{fmt}_plain").model
    for name, t in ref.state_dict().items():
        assert torch.equal(q.state_dict()[name], t), name
    lm = loaded(folders, fmt)
    ids, mm = q.prepare_multimodal(lm.tokenizer, "What is in the picture?", [synthetic_image(1)], True)
    torch.testing.assert_close(logits_of(q, ids, mm), logits_of(ref, ids, mm), rtol=0, atol=1e-5)
    bf16 = loaded(folders, "bf16").model  # quantization changed the experts, and so the logits, a little
    a, b = logits_of(q, ids, mm), logits_of(bf16, ids, mm)
    rel = ((a - b).norm() / b.norm()).item()
    assert 0 < rel < 0.5


def test_logits_match_transformers(folders):
    from transformers import Kimi_K25ForConditionalGeneration as HFKimi

    hf, info = HFKimi.from_pretrained(folders["bf16"], dtype=torch.float32, attn_implementation="eager",
                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    hf.eval()
    lm = loaded(folders, "bf16")
    m = lm.model
    # two images: a 6 x 8 grid (position embedding resized) and an 8 x 8 grid (the native 8 x 8 table as is)
    images = [synthetic_image(2), synthetic_image(3, (100, 100))]
    ids, mm = m.prepare_multimodal(lm.tokenizer, "Compare the two pictures.", images, True)
    assert mm.grid_hws == [(6, 8), (8, 8)]
    ours = logits_of(m, ids, mm)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids)[None], pixel_values=torch.cat(mm.pixel_values),
                 image_grid_thw=torch.tensor([[1, h, w] for h, w in mm.grid_hws])).logits
        text_ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}]))
        ref_text = hf(input_ids=torch.tensor(text_ids)[None]).logits
    assert ref.std() > 0.3
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(logits_of(m, text_ids, None), ref_text, rtol=0, atol=1e-4)


# --- images -------------------------------------------------------------------------------------------------------


def test_image_placeholders_and_features(folders):
    lm = loaded(folders, "bf16")
    m, tok = lm.model, lm.tokenizer
    pad = tok.token_to_id("<|media_pad|>")
    assert m.media_placeholder_token_id == pad
    ids, mm = m.prepare_multimodal(tok, "Describe it.", [synthetic_image(4)], True)
    (h, w), = mm.grid_hws
    assert (h, w) == (6, 8) and mm.pixel_values[0].shape == (48, 3, 14, 14)
    assert ids.count(pad) == (h // 2) * (w // 2) == 12
    first = ids.index(pad)
    assert ids[first - 1] == tok.token_to_id("<|media_content|>")
    assert ids[first + 12] == tok.token_to_id("<|media_end|>")
    assert tok.decode(ids, skip_special_tokens=False).startswith(
        "<|im_user|>user<|im_middle|><|media_begin|>image<|media_content|><|media_pad|>")
    # the image rows carry the projector output, in order; the text rows the token embeddings
    x = torch.tensor(ids)[None]
    with torch.inference_mode():
        emb = m.embed_multimodal(x, [mm])
        feats = m.encode_images(mm)
        plain = m.language_model.embed(x)
    rows = x[0] == pad
    torch.testing.assert_close(emb[0, rows], feats)
    torch.testing.assert_close(emb[0, ~rows], plain[0, ~rows])
    # a different image changes the logits after the image
    ids2, mm2 = m.prepare_multimodal(tok, "Describe it.", [synthetic_image(5)], True)
    assert ids2 == ids
    assert (logits_of(m, ids, mm)[0, -1] - logits_of(m, ids2, mm2)[0, -1]).abs().max() > 1e-2
    # messages with an image part, and prompts that already hold the placeholder
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}]
    assert m.prepare_multimodal(tok, msgs, [synthetic_image(4)], True)[0] == ids
    pre = tok.encode(tok.apply_chat_template([{"role": "user", "content": "<|media_pad|> and <|media_pad|>"}]))
    two, mm_two = m.prepare_multimodal(tok, pre, [synthetic_image(4), synthetic_image(6, (100, 100))], True)
    assert two.count(pad) == 12 + 16 and len(two) == len(pre) - 2 + 28


def test_placeholder_mismatch_is_a_clear_error(folders):
    lm = loaded(folders, "bf16")
    pre = lm.tokenizer.encode("<|media_pad|> one placeholder")
    with pytest.raises(RequestError, match="1 <\\|media_pad\\|> placeholders but 2 images"):
        lm.model.prepare_multimodal(lm.tokenizer, pre, [synthetic_image(1), synthetic_image(2)], True)
    with pytest.raises(RequestError, match="does not exist"):
        lm.model.prepare_multimodal(lm.tokenizer, "hi", ["/no/such/image.png"], True)


# --- speculative decoding -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["bf16", "int4", "nvfp4"])
def test_greedy_spec_equals_plain_text_and_images(folders, which):
    lm = loaded(folders, which)
    target, tok = lm.model, lm.tokenizer
    drafter = tiny_drafter(target, seed=3, draft_vocab=None,
                           eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    prompts = ["The capital of France is", "Describe the picture.", "Hello world"]
    images = [None, [synthetic_image(7)], [synthetic_image(8, (100, 100)), synthetic_image(9)]]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = Engine(target, tok).generate(prompts, params, images=images)
    text_only = Engine(target, tok).generate(prompts[1:2], params)
    assert plain[1].prompt_tokens == text_only[0].prompt_tokens + len(tok.encode(
        "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>")) - 1 + 12
    assert all(len(set(o.token_ids)) > 3 for o in plain)  # not degenerate
    for spec in (SpecConfig(3, 1, 4), SpecConfig(4, 3, 8)):
        eng = Engine(target, tok, EngineConfig(), drafter=drafter, spec=spec)
        outs = eng.generate(prompts, params, images=images)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
        assert eng.stats.verify_steps > 0
    target.set_eagle3_layers_to_capture(None)


def test_grouped_experts_on_the_graph_path_equal_plain(folders):
    """Kimi-K2.5 as CUDA runs it since session 54 (grouped experts, fused routers: `capturable`), through the graph
    path's static steps (run eagerly here, `GraphCache(capture=False)`): text and image prompts, plain and a chain,
    give the eager engine's tokens."""
    from eaglespec.engine.cuda_graphs import GraphCache, capturable
    from eaglespec.engine.transforms import use_grouped_experts, use_router_kernel

    lm = load_model(folders["bf16"])  # a copy of its own: the transforms change it
    target, tok = lm.model, lm.tokenizer
    prompts, images = ["The capital of France is", "Describe the picture."], [None, [synthetic_image(7)]]
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    plain = [o.token_ids for o in Engine(target, tok).generate(prompts, params, images=images)]
    drafter = tiny_drafter(target, seed=3, draft_vocab=None,
                           eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    assert not capturable(target)
    use_router_kernel(use_grouped_experts(target))
    assert capturable(target)
    for spec in (None, SpecConfig(3, 1, 4)):
        eng = Engine(target, tok, EngineConfig(), drafter=drafter if spec else None, spec=spec)
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
        assert [o.token_ids for o in eng.generate(prompts, params, images=images)] == plain
    target.set_eagle3_layers_to_capture(None)


def test_prompts_with_images_neither_keep_nor_reuse_cache_entries(folders):
    """Prefix reuse (engine/scheduler.py) is for text: two images of the same size give the same placeholder ids, so
    an image request's row keeps nothing and an image request reuses nothing; each answer is a fresh engine's."""
    lm = loaded(folders, "bf16")
    target, tok = lm.model, lm.tokenizer
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    prompt = "Describe the picture."
    eng = Engine(target, tok, EngineConfig(max_batch_size=1))
    eng.reserve(1, 256)
    for seed in (7, 8):
        out = eng.generate([prompt], params, images=[[synthetic_image(seed)]])[0]
        assert out.cached_tokens == 0 and eng.scheduler.kept == {}
        assert out.token_ids == Engine(target, tok).generate([prompt], params, images=[[synthetic_image(seed)]])[
            0].token_ids
    eng.generate([prompt], params)  # a text request's row keeps its tokens; the next text request reuses them
    assert eng.scheduler.kept and eng.generate([prompt], params)[0].cached_tokens > 0


def _undelegated_class(tmp_path: Path, monkeypatch) -> type:
    """KimiK25ForConditionalGeneration from a copy of its module whose class body lacks the delegate_eagle3 line."""
    import importlib.util
    import sys

    import eaglespec.models.kimi_k25 as kimi

    line = '    eagle3 = delegate_eagle3("language_model")\n'
    src = Path(kimi.__file__).read_text()
    assert src.count(line) == 1
    path = tmp_path / "kimi_k25_undelegated.py"
    path.write_text(src.replace(line, ""))
    name = "eaglespec.models.kimi_k25_undelegated"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # the check reads the class's module
    spec.loader.exec_module(module)
    return module.KimiK25ForConditionalGeneration


def test_wrapper_without_delegation_is_refused(tmp_path, monkeypatch):
    cls = _undelegated_class(tmp_path, monkeypatch)
    report = check_target(cls)
    assert not report.ok and set(report.missing) == set(PROTOCOL_METHODS)
    assert report.delegate_to == "language_model" and report.delegate_class == "DeepseekV3ForCausalLM"
    msg = report.message()
    assert "KimiK25ForConditionalGeneration does not implement" in msg
    assert 'eagle3 = delegate_eagle3("language_model")' in msg
    with torch.device("meta"):
        instance = cls(ModelConfig.from_hf(tiny_config(576)))
    assert "'language_model' (DeepseekV3ForCausalLM)" in check_target(instance).message()
    drafter = tiny_drafter(instance, draft_vocab=None)
    with pytest.raises(ProtocolError, match="language_model"):
        Engine(instance, None, drafter=drafter, spec=SpecConfig(2, 1, 3))
    # the class actually registered keeps its protocol methods in its own body
    for m in PROTOCOL_METHODS + ENGINE_METHODS:
        assert KimiK25ForConditionalGeneration.__dict__[m].__eagle3_delegate__ == "language_model"


# --- command line -------------------------------------------------------------------------------------------------


def test_check_cli(folders, capsys):
    assert main(["check", str(folders["nvfp4"])]) == 0
    assert "KimiK25ForConditionalGeneration implements the EAGLE-3 target protocol" in capsys.readouterr().out


def test_generate_cli_with_image(folders, tmp_path, capsys):
    path = tmp_path / "img.png"
    synthetic_image(10).save(path)
    stats = tmp_path / "stats.json"
    def argv(image: Path) -> list[str]:
        return ["generate", "Describe the picture.", "--model", str(folders["bf16"]), "--image", str(image),
                "--no-spec", "--max-new-tokens", "5", "--ignore-eos", "--device", "cpu", "--stats-json", str(stats)]

    assert main(argv(path)) == 0
    s = json.loads(stats.read_text())
    lm = loaded(folders, "bf16")
    ids, _ = lm.model.prepare_multimodal(lm.tokenizer, "Describe the picture.", [synthetic_image(10)], True)
    assert s["tokens"] == 5 and s["prompt_tokens"] == len(ids)
    capsys.readouterr()
    assert main(argv(tmp_path / "missing.png")) == 2
    assert "missing.png does not exist" in capsys.readouterr().err


def test_warm_for_an_image_prompt_sizes_the_caches_to_its_placeholders(folders, monkeypatch):
    """`eaglespec generate --image` warms up too: the caches fit the prompt with its image placeholders expanded, the
    step graphs are captured (bookkeeping only here), no prefill graph (image prefills run eagerly), and the
    request then runs in those caches and answers as plainly."""
    from eaglespec.engine.cuda_graphs import GraphCache

    lm = loaded(folders, "bf16")
    target, tok = lm.model, lm.tokenizer
    prompt, images = "Describe the picture.", [synthetic_image(11)]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    plain = Engine(target, tok).generate([prompt], params, images=[images])[0].token_ids
    eng = Engine(target, tok, EngineConfig(max_batch_size=1))
    g = eng.runner.graphs = GraphCache(eng.runner, capture=False)
    g.capture = True
    captured = []
    monkeypatch.setattr(g, "_capture", captured.append)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    n = eng.warm_for(prompt, params, images=images)
    ids, _ = target.prepare_multimodal(tok, prompt, images, True)
    assert eng.runner.max_len == len(ids) + 6 and n == len(captured) > 0
    assert all(k[0] != "prefill" for k in captured)
    g.capture = False
    kv = eng.runner.kv
    assert eng.generate([prompt], params, images=[images])[0].token_ids == plain and eng.runner.kv is kv


def test_serve_takes_images_for_the_multimodal_target(folders):
    """`eaglespec serve`'s app on the tiny Kimi-K2.5 wrapper: a chat message with a data: URL image between its text
    parts answers (greedy, speculative) as the engine does given the same messages and the decoded image, with the
    image's expanded placeholders counted in the prompt tokens; a broken image is a 400."""
    import base64
    import io

    from fastapi.testclient import TestClient

    from eaglespec.server.app import create_app
    from eaglespec.server.worker import EngineWorker

    lm = loaded(folders, "bf16")
    target, tok = lm.model, lm.tokenizer
    image = synthetic_image(11)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    parts = [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": url}},
             {"type": "text", "text": "What is it?"}]
    in_engine = [{"role": "user", "content": [parts[0], {"type": "image_url"}, parts[2]]}]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want = Engine(target, tok).generate([in_engine], params, images=[[image]])[0]
    drafter = tiny_drafter(target, seed=3, draft_vocab=None,
                           eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    worker = EngineWorker(Engine(target, tok, EngineConfig(max_batch_size=2), drafter=drafter,
                                 spec=SpecConfig(3, 1, 4)), rows=2, max_len=256).start()
    try:
        with TestClient(create_app(worker, "kimi", default_temperature=0.0)) as client:
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}],
                                                           "max_tokens": 12, "ignore_eos": True})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["message"]["content"] == want.text
            assert body["usage"]["prompt_tokens"] == want.prompt_tokens
            assert body["usage"]["prompt_tokens"] > len(tok.encode(tok.apply_chat_template(
                [{"role": "user", "content": "Look:What is it?"}]))) + 10  # the image's tokens are in it
            bad = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
                "url": "data:image/png;base64,AAAA"}}]}]}
            r = client.post("/v1/chat/completions", json=bad)
            assert r.status_code == 400 and "could not be read as an image" in r.json()["error"]["message"]
    finally:
        worker.stop()
        target.set_eagle3_layers_to_capture(None)


def test_chat_attaches_images_to_the_next_message(folders, tmp_path, capsys, monkeypatch):
    """`eaglespec chat` on the tiny Kimi wrapper: `/image PATH` goes with the next message, and stays with it in the
    conversation's later turns; the answers are the engine's for those messages and images."""
    import io

    from eaglespec import api

    path = tmp_path / "img.png"
    synthetic_image(12).save(path)
    monkeypatch.setattr("sys.stdin", io.StringIO(f"/image {tmp_path / 'missing.png'}\n/image {path}\n"
                                                 "Describe it.\nAnd the colours?\n"))
    assert main(["chat", "--model", str(folders["bf16"]), "--no-spec", "--max-new-tokens", "6", "--ignore-eos",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr()
    assert "/image needs an image file" in out.err and "img.png goes with the next message" in out.err
    eng = api.load(folders["bf16"], draft=None, config=EngineConfig(device="cpu", max_batch_size=1))
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    image = Image.open(path)
    first = [{"role": "user", "content": [{"type": "image_url"}, {"type": "text", "text": "Describe it."}]}]
    a1 = eng.generate([first], params, images=[[image]])[0].text
    second = first + [{"role": "assistant", "content": a1}, {"role": "user", "content": "And the colours?"}]
    a2 = eng.generate([second], params, images=[[image]])[0].text
    assert out.out == f"{a1}\n{a2}\n"


def test_generate_and_chat_keep_a_thinking_answers_reasoning_apart(folders, tmp_path, capsys, monkeypatch):
    """The tiny Kimi wrapper with a template that opens `<think>` in the generation prompt (Kimi-K2.5's thinking
    mode) and a model that never closes it: `generate` prints its whole answer as reasoning, to stderr, leaving
    stdout empty; `chat` the same, and keeps the answer without its reasoning (empty) in the conversation it sends
    next. The reasoning is what plain decoding writes (special tokens skipped)."""
    import io
    import shutil

    from eaglespec import api

    folder = tmp_path / "thinking"
    shutil.copytree(folders["bf16"], folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    opening = "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    assert opening in cfg["chat_template"]
    cfg["chat_template"] = cfg["chat_template"].replace(opening, opening + "<think>")
    cfg_path.write_text(json.dumps(cfg))
    eng = api.load(folder, draft=None, config=EngineConfig(device="cpu", max_batch_size=1))
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    thought = eng.generate(["Hi"], params)[0].text
    assert thought.strip()
    assert main(["generate", "Hi", "--model", str(folder), "--no-spec", "--max-new-tokens", "5", "--ignore-eos",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr()
    assert out.out == "\n" and out.err.startswith(thought + "\n\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\nAgain?\n"))
    assert main(["chat", "--model", str(folder), "--no-spec", "--max-new-tokens", "5", "--ignore-eos",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr()
    second = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""},
              {"role": "user", "content": "Again?"}]
    assert out.out == "\n\n" and thought in out.err and eng.generate([second], params)[0].text in out.err
