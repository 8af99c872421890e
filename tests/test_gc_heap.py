"""engine/gc_heap.py: what `freeze_heap` takes out of full collections, and where the CLI calls it (conftest.py
unfreezes after every test)."""

from __future__ import annotations

import gc
import json

from eaglespec.engine import gc_heap
from eaglespec.engine.gc_heap import freeze_heap


def test_freeze_takes_live_objects_out_of_full_collections():
    kept = [[i] for i in range(2000)]  # tracked containers, alive at the freeze
    n = freeze_heap()
    assert n == gc.get_freeze_count() >= len(kept)
    walked = {id(o) for o in gc.get_objects()}  # what a collection walks: frozen objects are not among them
    assert not any(id(x) in walked for x in kept)
    later = [[i] for i in range(10)]  # objects made after the freeze are walked (and collected) as usual
    assert all(id(x) in {id(o) for o in gc.get_objects()} for x in later)
    # and cyclic garbage made after the freeze is still collected
    cycle = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


def test_bench_freezes_after_loading_and_before_its_engines(tmp_path, monkeypatch):
    """`eaglespec bench` freezes once, after the model and the prompts exist, before any engine is built (an engine
    it drops must stay collectable: it and its graph cache refer to each other)."""
    from eaglespec.cli import bench as bench_cli
    from eaglespec.cli import main
    from eaglespec.engine import engine as engine_mod

    events: list[str] = []
    monkeypatch.setattr(bench_cli, "freeze_heap", lambda: events.append("freeze") or 0)
    built = engine_mod.Engine.__init__

    def init(self, *a, **k):
        events.append("engine")
        built(self, *a, **k)

    monkeypatch.setattr(engine_mod.Engine, "__init__", init)
    cfg = tmp_path / "shape.json"
    cfg.write_text(json.dumps(dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=101,
                                   hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)))
    code = main(["bench", "--random-weights", str(cfg), "--prompt-len", "6", "--limit", "2", "--batch-sizes", "1",
                 "--no-spec", "--max-new-tokens", "3", "--device", "cpu", "--out", str(tmp_path / "out")])
    assert code == 0
    assert events[0] == "freeze" and events.count("freeze") == 1 and "engine" in events
    assert gc_heap.freeze_heap is not bench_cli.freeze_heap  # the patch, not the real one, ran
