"""The results plot (matplotlib, Agg backend: no display needed): tok/s per configuration and batch size, and the
acceptance-length histograms.

`plot(doc, path)` reads a results document (report.py) and writes a PNG with two panels: grouped bars of tok/s (one
group per batch size, one bar per configuration; at most MAX_CONFIGS configurations, the fastest, plus the no-spec
baseline and the peer) and, per speculative configuration at the first batch size (same colours), the fraction of
verification steps with each acceptance length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_CONFIGS = 12


def _pick(records: list[dict[str, Any]]) -> list[str]:
    names = list(dict.fromkeys(r["config"] for r in records))
    if len(names) <= MAX_CONFIGS:
        return names
    best: dict[str, float] = {}
    for r in records:
        best[r["config"]] = max(best.get(r["config"], 0.0), r["tok_per_s"])
    fixed = [n for n in names if any(r["config"] == n and r["kind"] != "spec" for r in records)]
    rest = sorted((n for n in names if n not in fixed), key=lambda n: -best[n])
    keep = set(fixed + rest[: MAX_CONFIGS - len(fixed)])
    return [n for n in names if n in keep]


def plot(doc: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (matplotlib.ticker below)

    records = doc.get("summary") or doc["records"]  # with --repeats: the medians over the rounds
    names = _pick(records)
    cmap = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    color = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
    sizes = sorted({r["batch_size"] for r in records})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ys = [next((r["tok_per_s"] for r in records if r["config"] == name and r["batch_size"] == b), 0.0)
              for b in sizes]
        ax1.bar([j + i * width for j in range(len(sizes))], ys, width, label=name, color=color[name])
    ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))])
    ax1.set_xticklabels([f"batch {b}" for b in sizes])
    ax1.set_ylabel("output tok/s")
    ax1.set_title(f"{doc['model']['source']} ({doc['model']['dtype']}, {doc['machine']['device']})", fontsize=9)
    ax1.legend(fontsize=7)

    first = sizes[0] if sizes else None
    spec = [r for r in records if r["accept_length_hist"] and r["batch_size"] == first and r["config"] in names]
    hw = 0.8 / max(len(spec), 1)
    for i, r in enumerate(spec):
        hist = {int(t): n for t, n in r["accept_length_hist"].items()}
        total = sum(hist.values()) or 1
        taus = sorted(hist)
        ax2.bar([t - 0.4 + hw / 2 + i * hw for t in taus], [hist[t] / total for t in taus], hw,
                color=color[r["config"]], label=f"{r['config']} (mean {r['accept_length_mean']:.2f})")
    ax2.set_xlabel("acceptance length tau (tokens per verification)")
    ax2.set_ylabel("fraction of verification steps")
    ax2.set_title(f"acceptance length, batch {first}" if spec else "no speculative run", fontsize=9)
    if spec:
        ax2.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
