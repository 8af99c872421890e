"""Why does the host take ~50 us to launch a chain's verify graph and ~4 us to launch a decode graph of as many
kernels? (graph_launch_probe.py, session 65: `replay()` of the one-row verify graph 47-55 us of host time, the
decode graph's 3.4-6 us, the drafting graph's 24 kernels 11-13 us.)

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs), engines of one row stepped 30 steps after a
128-token prompt, their graphs captured with `keep_graph=True` (torch.cuda.CUDAGraph patched before the engine
builds any), so that the driver can be asked what each holds. Per graph (the plain decode graph and the chain S3 K1
D4's draft / verify / commit):

- nodes by type and edges by type (cuGraphGetNodes / cuGraphNodeGetType / cuGraphGetEdges_v2: default or
  programmatic), roots; the kernel nodes' functions by name (cuFuncGetName), counted;
- the host's time in one `replay()` with the stream idle (median of 200), and under torch.profiler with CPU
  activities: the host-side events of 20 replays by name (cudaGraphLaunch, any aten op PyTorch runs around it).

usage: python benchmarks/graph_nodes_probe.py OUT_DIR [--draft-vocab=N]
"""

from __future__ import annotations

import ctypes
import json
import time
from collections import Counter

import torch

_Graph = torch.cuda.CUDAGraph


class _Kept(_Graph):  # every graph the engine captures keeps its cudaGraph_t (the binding reads __init__'s argument)
    def __new__(cls, keep_graph: bool = True):
        return super().__new__(cls, True)

    def __init__(self, keep_graph: bool = True) -> None:
        super().__init__(True)


torch.cuda.CUDAGraph = _Kept

from probe_script import OUT, current_graphs, option, random_pair, stepped_engine  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402

cu = ctypes.CDLL("libcuda.so.1")
NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "child", 5: "empty", 6: "event_wait",
              7: "event_record", 8: "sem_signal", 9: "sem_wait", 10: "mem_alloc", 11: "mem_free", 12: "batch_mem_op",
              13: "conditional"}


class EdgeData(ctypes.Structure):
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


class KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2 (func first; kern / ctx after the v1 fields)
    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p),
                ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def structure(g) -> dict:
    """Node and edge counts by type, roots, kernel functions by name, of a kept graph."""
    h = ctypes.c_void_p(g.raw_cuda_graph())
    n = ctypes.c_size_t(0)
    check(cu.cuGraphGetNodes(h, None, ctypes.byref(n)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * n.value)()
    check(cu.cuGraphGetNodes(h, nodes, ctypes.byref(n)), "cuGraphGetNodes")
    types: Counter = Counter()
    names: Counter = Counter()
    for node in nodes:
        t = ctypes.c_int(0)
        check(cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t)), "cuGraphNodeGetType")
        types[NODE_TYPES.get(t.value, str(t.value))] += 1
        if t.value == 0:
            p = KernelParams()
            if cu.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(p)) == 0:
                name = ctypes.c_char_p()
                ok = hasattr(cu, "cuFuncGetName") and p.func and \
                    cu.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(p.func)) == 0 and name.value
                names[(name.value.decode()[:60] if ok else "?")] += 1
    ne = ctypes.c_size_t(0)
    check(cu.cuGraphGetEdges_v2(h, None, None, None, ctypes.byref(ne)), "cuGraphGetEdges_v2")
    src, dst = (ctypes.c_void_p * ne.value)(), (ctypes.c_void_p * ne.value)()
    data = (EdgeData * ne.value)()
    check(cu.cuGraphGetEdges_v2(h, src, dst, data, ctypes.byref(ne)), "cuGraphGetEdges_v2")
    edge_types = Counter({0: "default", 1: "programmatic", 2: "programmatic_launch"}.get(e.type, str(e.type))
                         for e in data)
    roots = ctypes.c_size_t(0)
    check(cu.cuGraphGetRootNodes(h, None, ctypes.byref(roots)), "cuGraphGetRootNodes")
    return {"nodes": n.value, "node_types": dict(types), "edges": ne.value, "edge_types": dict(edge_types),
            "roots": roots.value, "kernels": dict(names.most_common())}


def host_side(g) -> dict:
    """The host's time in one replay() with the stream idle (median of 200, us), and the host events of 20 replays
    under the profiler (us per replay, by name)."""
    from torch.profiler import ProfilerActivity, profile

    times = []
    for _ in range(200):
        torch.cuda.synchronize()
        t = time.perf_counter()
        g.replay()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            g.replay()
            torch.cuda.synchronize()
    per: Counter = Counter()
    count: Counter = Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CPU and "Synchronize" not in ev.name:
            per[ev.name[:50]] += ev.time_range.end - ev.time_range.start
            count[ev.name[:50]] += 1
    return {"replay_us_median": round(1e6 * sorted(times)[100], 1),
            "host_events": {k: [round(v / 20, 1), count[k] / 20] for k, v in per.most_common(12)}}


m, d = random_pair(draft_vocab=int(option("draft-vocab", "0")) or None)
out = {}
e = stepped_engine(m)
for name, g in current_graphs(e, "decode", 1):
    out[f"plain_{name}"] = {**structure(g), **host_side(g)}
del e
e = stepped_engine(m, d, SpecConfig(3, 1, 4))
for name, g in current_graphs(e, "spec", 1):
    out[f"chain_{name}"] = {**structure(g), **host_side(g)}
(OUT / "graph_nodes.json").write_text(json.dumps(out, indent=1))
for name, r in out.items():
    print(f"\n== {name}: {r['nodes']} nodes {r['node_types']}, {r['edges']} edges {r['edge_types']}, "
          f"{r['roots']} roots; replay() {r['replay_us_median']} us")
    for k, (us, c) in r["host_events"].items():
        print(f"   host {k:<50} {us:8.1f} us  x{c}")
    print("   kernels: " + ", ".join(f"{k} x{v}" for k, v in r["kernels"].items()))
