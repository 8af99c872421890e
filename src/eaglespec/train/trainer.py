"""The training loop: optimiser, schedule, checkpoints and resume, progress, evaluation.

Contract of `Trainer(target, drafter, train_ds, eval_ds, vocab, config).fit()`:
- the target is frozen in eval mode with capture on (`set_eagle3_layers_to_capture(config.aux_layers)`); per batch it
  runs once (features.py; on the GPU a CUDA graph per batch shape, feature_graphs.py, unless `feature_graphs` is
  off) and the drafter runs the S-step TTT (ttt.py), under bf16 autocast on CUDA (float32 on the CPU); AdamW over
  `trainable_parameters` (lr, betas 0.9/0.95, weight decay), linear warm-up over `warmup_frac` of the steps then
  cosine decay to 0, gradient clipping, one optimiser step per batch;
- steps: `max_steps` if set, else `epochs` x batches. Batches are length-bucketed once (dataset.py) and shuffled per
  epoch from (seed, epoch), so the data position is (epoch, index in that epoch's order);
- every `save_every` steps (and at the end, at `stop_after`, and on SIGINT / SIGTERM) a checkpoint
  `work_dir/checkpoints/step-N.pt`
  holds the trainable weights, d2t/t2d, optimiser, scheduler, step and data position (the last `keep` are kept);
  `resume=True` continues from the newest one and reaches the same state as an uninterrupted run; settings that
  would change the run (steps, lr, batch tokens, seed, ...) and the training tokens and loss mask (a hash: other data,
  --max-len, --loop-keep) must match, else `ConfigError`; a run without `resume`
  starts over (old checkpoints and the log are removed);
- SIGINT or SIGTERM (Ctrl-C, `timeout`, a scheduler's preemption) during `fit` ends it after the step or evaluation
  in progress, with a checkpoint: `interrupted` holds the signal's number and `--resume` continues from there (the
  handlers are the previous ones again from the first signal on, so a second one acts at once; `catch_signals`
  False, or `fit` off the main thread, leaves the signals alone);
- tqdm shows the loss and the per-step top-1 accuracy; every step is appended to `work_dir/train_log.jsonl` (step,
  loss, acc, lr, tokens, seconds: the step's wall time);
- `evaluate()` runs the held-out split without gradients and returns per-step accuracy, loss and the estimated
  chain acceptance length 1 + sum_k prod_{i<=k} acc_i (`eval_every` steps and at the end); the weights of the
  evaluation with the highest estimate are kept (`best`, also in checkpoints) and `use_best()` loads them, so the
  pipeline can export the best held-out drafter rather than the last (they differ once training overfits);
  `eval_at_start` also evaluates before the first step: a continued drafter's starting point, kept as `baseline`
  (also in checkpoints) and never `best`: exporting it would hand the input back untrained, and a held-out split
  drawn from data the input was trained on favours it (a 5,000-step continuation was lost so: its step-0 estimate,
  inflated so, beat the trained one by 0.001);
  `extra_eval` sets (name -> dataset, e.g. MT-bench's prompts answered by the target) are evaluated at the same
  steps and logged (`{"step", "eval_set", "eval"}` lines, `extra_evals`) but never choose the weights: fitting the
  export to a benchmark would overstate it;
- `aux_sample(n)`: the target's aux states at the real tokens of the first n batches (calibrating added norms).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .dataset import TokenDataset, epoch_order, gather_batch, make_batches, padded_length
from .drafter import trainable_parameters
from .feature_graphs import FeatureGraphs
from .ttt import acceptance_estimate, ttt_hiddens, ttt_loss
from .vocab import DraftVocab

# Settings a resumed run must share with the run that wrote the checkpoint.
RESUME_KEYS = ("ttt_steps", "step_decay", "lr", "warmup_frac", "weight_decay", "grad_clip", "batch_tokens", "epochs",
               "max_steps", "seed", "ttt_align", "label_sharpen")
# the value a setting added later had in the runs that wrote checkpoints without it
RESUME_DEFAULTS = {"ttt_align": 0, "label_sharpen": 1.0}


def data_fingerprint(ds: TokenDataset) -> str:
    """A hash of a dataset's tokens, loss mask and sample boundaries (what a resumed run must share)."""
    h = hashlib.sha256()
    for t in (ds.tokens, ds.mask, ds.offsets):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class TrainConfig:
    work_dir: str
    aux_layers: tuple[int, ...]
    ttt_steps: int = 7
    step_decay: float = 0.8
    ttt_align: int = 0  # ttt.py's aligned positions: a step's loss only where every earlier step ranked the target's
                        # token in its top K (0: every position, as published)
    label_sharpen: float = 1.0  # ttt.py's sharpened labels: the soft label p^a, renormalised (1: p, as published)
    lr: float = 1e-4
    warmup_frac: float = 0.015
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    batch_tokens: int = 16384
    epochs: int = 1
    max_steps: int | None = None
    stop_after: int | None = None  # stop (with a checkpoint) once this many steps are done; the schedule is unchanged
    eval_every: int = 0  # 0: only at the end
    eval_at_start: bool = False  # also evaluate before the first step (a continued drafter's starting point: the
                                 # `baseline`, never exported)
    save_every: int = 500
    keep: int = 2
    seed: int = 0
    resume: bool = False
    amp: bool = True  # bf16 autocast on CUDA
    progress: bool = True
    log_every: int = 1  # tqdm postfix refresh (each refresh reads the loss: one device sync)
    catch_signals: bool = True  # SIGINT / SIGTERM: stop after the step in progress, with a checkpoint
    feature_graphs: bool = True  # on CUDA the target's features forward as a CUDA graph per batch shape (the same
                                 # values; False: eager, without the graphs' reserved memory pool)

    def __post_init__(self) -> None:
        if self.ttt_steps < 1:
            raise ConfigError(f"--ttt-steps must be >= 1 (got {self.ttt_steps})")
        if self.ttt_align < 0:
            raise ConfigError(f"--ttt-align must be >= 0 (got {self.ttt_align})")
        if not self.label_sharpen > 0:
            raise ConfigError(f"--label-sharpen must be > 0 (got {self.label_sharpen})")
        if self.lr <= 0:
            raise ConfigError(f"--lr must be > 0 (got {self.lr})")
        if self.batch_tokens < 1:
            raise ConfigError(f"--batch-tokens must be >= 1 (got {self.batch_tokens})")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max-steps must be >= 1 (got {self.max_steps})")
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be >= 1 (got {self.epochs})")


@dataclass
class StepRecord:
    step: int
    loss: float
    acc: list[float]
    lr: float
    tokens: int
    seconds: float = 0.0  # wall time of the step: features, TTT, backward, optimiser, up to its one read of results


@dataclass
class EvalResult:
    acc: list[float]
    loss: float
    accept_length: float
    positions: list[int] = field(default_factory=list)
    # the chain's conditional accuracy per step (ttt.py: positions whose earlier drafts were all right) and its
    # estimate, the acceptance length per position of a chain of that many steps
    chain_acc: list[float] = field(default_factory=list)
    chain_accept_length: float = 0.0

    def line(self) -> str:
        accs = " ".join(f"{a:.3f}" for a in self.acc)
        # a chain of 3 (S3 K1 D4) is what `eaglespec bench` and `auto` run at one row: its estimate from the first
        # three steps is the one comparable with a measured acceptance length
        three = f" (3 steps: {acceptance_estimate(self.acc[:3]):.3f})" if len(self.acc) > 3 else ""
        chain = ""
        if self.chain_acc:
            chain = (f"; chain's conditional accuracy [{' '.join(f'{a:.3f}' for a in self.chain_acc)}], "
                     f"acceptance per position {self.chain_accept_length:.3f}"
                     + (f" (3 steps: {acceptance_estimate(self.chain_acc[:3]):.3f})" if len(self.chain_acc) > 3
                        else ""))
        return (f"eval: loss {self.loss:.4f}, per-step accuracy [{accs}], "
                f"estimated chain acceptance {self.accept_length:.3f}{three}{chain}")


class Trainer:
    def __init__(self, target: torch.nn.Module, drafter: torch.nn.Module, train_ds: TokenDataset,
                 eval_ds: TokenDataset | None, vocab: DraftVocab, config: TrainConfig,
                 extra_eval: dict[str, TokenDataset] | None = None) -> None:
        self.cfg = config
        self.device = next(target.parameters()).device
        self.target = target.eval()
        self.target.requires_grad_(False)
        self.target.set_eagle3_layers_to_capture(list(config.aux_layers))
        self.drafter = drafter.to(self.device).train()
        self.vocab = vocab.to(self.device)
        self.t2d_map = self.vocab.target_to_draft
        self.train_ds = train_ds.to(self.device)
        self.eval_ds = eval_ds.to(self.device) if eval_ds is not None and len(eval_ds) else None
        # other evaluation sets (e.g. MT-bench answered by the target): reported beside the held-out split, never
        # used to choose the exported weights
        self.extra_eval = {n: d.to(self.device) for n, d in (extra_eval or {}).items() if len(d)}
        self.batches = make_batches(train_ds.lengths, config.batch_tokens)
        self.data_hash = data_fingerprint(train_ds)  # a resumed run must train on the same tokens and loss mask
        # on the GPU every new sequence length costs a slow first step (allocator, kernel selection): pad to 64
        self.pad_to = 64 if self.device.type == "cuda" else 1
        self.total_steps = config.max_steps or config.epochs * len(self.batches)
        # the target's features forward, replayed as a CUDA graph per batch shape on the GPU (feature_graphs.py)
        self.features = FeatureGraphs(self.target, self.vocab, self.t2d_map,
                                      mode=None if config.feature_graphs else "eager")
        # its buffers sized once for the largest padded batch of every set it will see (growing them later drops
        # the graphs captured so far)
        self.features.reserve(max(self._padded_tokens(ds, batches) for ds, batches in (
            (train_ds, self.batches),
            *((d, make_batches(d.lengths.cpu(), config.batch_tokens))
              for d in ([eval_ds] if self.eval_ds is not None else []) + list(self.extra_eval.values())))))
        self.params = trainable_parameters(drafter)
        self.opt = torch.optim.AdamW(self.params.values(), lr=config.lr, betas=(0.9, 0.95),
                                     weight_decay=config.weight_decay)
        warmup = max(1, math.ceil(config.warmup_frac * self.total_steps))
        total = self.total_steps

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, schedule)
        self.step = 0
        self.epoch = 0
        self.pos = 0  # index into the current epoch's batch order
        self.history: list[StepRecord] = []
        self.evals: list[tuple[int, EvalResult]] = []
        self.extra_evals: list[tuple[int, str, EvalResult]] = []
        # the best held-out evaluation so far (by estimated chain acceptance): {"step", "score", "eval", "weights"}
        self.best: dict[str, Any] | None = None
        # the evaluation before the first step (`eval_at_start`): {"score", "eval"}; compared with, never exported
        self.baseline: dict[str, Any] | None = None
        self.interrupted: int | None = None  # the signal that ended the last `fit` early (module docstring)
        self.work = Path(config.work_dir)
        self.ckpt_dir = self.work / "checkpoints"
        if config.resume:
            self.load_latest()

    def _padded_tokens(self, ds: TokenDataset, batches: list[torch.Tensor]) -> int:
        """The largest B x T of `batches` of `ds` once padded (gather_batch)."""
        lens = ds.lengths.tolist()
        return max((len(b) * padded_length(max(lens[i] for i in b.tolist()), self.pad_to) for b in batches), default=0)

    # --- one batch --------------------------------------------------------------------------------------------------
    def _autocast(self):
        if self.cfg.amp and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def _forward(self, ds: TokenDataset, ids: torch.Tensor, align: int = 0, sharpen: float = 1.0):
        batch = gather_batch(ds, ids, self.pad_to)
        feats = self.features(batch.tokens)  # valid until the next batch's features: used up within this step
        with self._autocast():
            hiddens = ttt_hiddens(self.drafter, batch.tokens, feats.aux, self.cfg.ttt_steps)
            res = ttt_loss(self.drafter, hiddens, feats, batch.mask, self.cfg.step_decay, align, sharpen)
        return batch, res

    def train_step(self, ids: torch.Tensor) -> StepRecord:
        t0 = time.perf_counter()
        batch, res = self._forward(self.train_ds, ids, self.cfg.ttt_align, self.cfg.label_sharpen)
        self.opt.zero_grad(set_to_none=True)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.cfg.grad_clip)
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.sched.step()
        acc = (res.correct / res.count.clamp(min=1)).tolist()  # the step's one read of device values
        return StepRecord(self.step + 1, float(res.loss.detach()), acc, lr, batch.n_tokens, time.perf_counter() - t0)

    # --- loop -------------------------------------------------------------------------------------------------------
    def fit(self) -> list[StepRecord]:
        from tqdm.auto import tqdm

        cfg = self.cfg
        self.work.mkdir(parents=True, exist_ok=True)
        end = self.total_steps if cfg.stop_after is None else min(self.total_steps, cfg.stop_after)
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step", disable=not cfg.progress,
                   dynamic_ncols=True)
        fresh = not cfg.resume and self.step == 0
        if fresh:  # a run without --resume starts over: stale checkpoints must never be resumed from later
            for old in self.ckpt_dir.glob("step-*.pt"):
                old.unlink()
        log = (self.work / "train_log.jsonl").open("w" if fresh else "a")
        self.interrupted = None
        previous = self._catch_signals()
        try:
            if self.step == 0 and cfg.eval_at_start and self.evaluating:  # --resume of no checkpoint too
                self._log_eval(log, bar)
            while self.step < end and self.interrupted is None:
                order = epoch_order(len(self.batches), cfg.seed, self.epoch)
                while self.pos < len(order) and self.step < end and self.interrupted is None:
                    rec = self.train_step(self.batches[order[self.pos]])
                    self.pos += 1
                    self.step += 1
                    self.history.append(rec)
                    log.write(json.dumps(asdict(rec)) + "\n")
                    bar.update(1)
                    if self.step % cfg.log_every == 0:
                        bar.set_postfix_str(f"loss {rec.loss:.3f} acc " + "/".join(f"{a:.2f}" for a in rec.acc[:4]))
                    if cfg.eval_every and self.step % cfg.eval_every == 0 and self.evaluating:
                        self._log_eval(log, bar)  # before the checkpoint, which keeps the best weights so far
                    if cfg.save_every and self.step % cfg.save_every == 0:
                        self.save()
                if self.pos >= len(order):
                    self.epoch += 1
                    self.pos = 0
            if self.step >= end:
                self.interrupted = None  # a signal during the last step stopped nothing
            if not (cfg.save_every and self.step % cfg.save_every == 0):
                self.save()  # the end, stop_after or a signal: the state to resume from
            if self.step >= self.total_steps and self.evaluating and not (
                    cfg.eval_every and self.step % cfg.eval_every == 0):
                self._log_eval(log, bar)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            bar.close()
            log.close()
        return self.history

    def _catch_signals(self) -> dict[int, Any]:
        """Install the SIGINT / SIGTERM handlers of `fit` (module docstring); returns the previous handlers."""
        if not self.cfg.catch_signals or threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}

        def stop(signum: int, frame: Any) -> None:
            self.interrupted = signum
            for sig, handler in previous.items():  # a second signal acts as it would have without us
                signal.signal(sig, handler)

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, stop)
        return previous

    @property
    def evaluating(self) -> bool:
        return self.eval_ds is not None or bool(self.extra_eval)

    def _log_eval(self, log, bar) -> None:
        if self.eval_ds is not None:
            res = self.evaluate()
            self.evals.append((self.step, res))
            if self.step == 0:
                self.baseline = {"score": res.accept_length, "eval": asdict(res)}
            elif self.best is None or res.accept_length > self.best["score"]:
                self.best = {"step": self.step, "score": res.accept_length, "eval": asdict(res),
                             "weights": {n: p.detach().cpu().clone() for n, p in self.params.items()}}
            log.write(json.dumps({"step": self.step, "eval": asdict(res)}) + "\n")
            bar.write(f"step {self.step}: {res.line()}")
        for name, ds in self.extra_eval.items():
            res = self.evaluate(ds)
            self.extra_evals.append((self.step, name, res))
            log.write(json.dumps({"step": self.step, "eval_set": name, "eval": asdict(res)}) + "\n")
            bar.write(f"step {self.step}: {name} {res.line()}")
        log.flush()

    @torch.no_grad()
    def aux_sample(self, n_batches: int = 4) -> torch.Tensor:
        """The target's aux states [N, n_aux*Ht] (float32) at every real token of the first `n_batches` training
        batches (in storage order: the same sample on every run over the same data)."""
        out = []
        for ids in self.batches[:n_batches]:
            batch = gather_batch(self.train_ds, ids, self.pad_to)
            feats = self.features(batch.tokens)
            inside = torch.arange(batch.tokens.shape[1], device=batch.tokens.device)[None, :] < batch.lengths[:, None]
            out.append(feats.aux[inside.to(feats.aux.device)].float())
        return torch.cat(out)

    @torch.no_grad()
    def evaluate(self, ds: TokenDataset | None = None) -> EvalResult:
        """The held-out split (or `ds`, on the trainer's device) without gradients. Every position counts (as
        published, whatever `ttt_align` trains on), against the target's own distributions (whatever
        `label_sharpen`), so that runs of any kind compare; the chain's conditional accuracy is counted beside."""
        ds = self.eval_ds if ds is None else ds
        assert ds is not None
        self.drafter.eval()
        S = self.cfg.ttt_steps
        correct = torch.zeros(S, device=self.device)
        count = torch.zeros(S, device=self.device)
        loss_sum = torch.zeros(S, device=self.device)
        chain_correct = torch.zeros(S, device=self.device)
        chain_count = torch.zeros(S, device=self.device)
        for ids in make_batches(ds.lengths.cpu(), self.cfg.batch_tokens):
            _, res = self._forward(ds, ids)
            correct += res.correct
            count += res.count
            loss_sum += res.step_loss * res.count
            chain_correct += res.chain_correct
            chain_count += res.chain_count
        self.drafter.train()
        acc = (correct / count.clamp(min=1)).tolist()
        step_loss = (loss_sum / count.clamp(min=1)).tolist()
        loss = sum(self.cfg.step_decay**k * v for k, v in enumerate(step_loss))
        chain_acc = (chain_correct / chain_count.clamp(min=1)).tolist()
        return EvalResult(acc=acc, loss=loss, accept_length=acceptance_estimate(acc),
                          positions=[int(c) for c in count.tolist()], chain_acc=chain_acc,
                          chain_accept_length=acceptance_estimate(chain_acc))

    # --- checkpoints ------------------------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        return {k: getattr(self.cfg, k) for k in RESUME_KEYS}

    def save(self) -> Path:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "step": self.step, "epoch": self.epoch, "pos": self.pos,
            "weights": {n: p.detach().cpu() for n, p in self.params.items()},
            "d2t": self.drafter.d2t.cpu(), "t2d": self.drafter.t2d.cpu(),
            "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
            "settings": self._settings(), "n_batches": len(self.batches), "data": self.data_hash, "best": self.best,
            "baseline": self.baseline,
        }
        path = self.ckpt_dir / f"step-{self.step:08d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        for old in sorted(self.ckpt_dir.glob("step-*.pt"))[: -self.cfg.keep]:
            old.unlink()
        return path

    def load_latest(self) -> bool:
        found = sorted(self.ckpt_dir.glob("step-*.pt"))
        if not found:
            return False
        path = found[-1]
        state = torch.load(path, map_location="cpu", weights_only=False)
        for k, v in self._settings().items():
            was = state["settings"].get(k, RESUME_DEFAULTS.get(k))
            if was != v:
                raise ConfigError(f"cannot resume from {path}: it was written with {k}={was!r}, this run has {k}={v!r}")
        if state["n_batches"] != len(self.batches):
            raise ConfigError(f"cannot resume from {path}: the training data differ (its run had "
                              f"{state['n_batches']} batches, this one has {len(self.batches)})")
        if state.get("data", self.data_hash) != self.data_hash:
            raise ConfigError(f"cannot resume from {path}: the training tokens or their loss mask differ from this "
                              "run's (other data, --max-len, --long or --loop-keep? or a checkpoint of an eaglespec "
                              "that kept the tokens after a sample's last loss token)")
        if not (state["d2t"].equal(self.vocab.d2t.cpu()) and state["t2d"].equal(self.vocab.t2d.cpu())):
            raise ConfigError(f"cannot resume from {path}: its draft vocabulary differs from this run's (other data?)")
        self._load_weights(state["weights"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.step, self.epoch, self.pos = state["step"], state["epoch"], state["pos"]
        self.best, self.baseline = state.get("best"), state.get("baseline")
        if self.best is not None and self.best["step"] == 0:  # written when the start could win (before 2026-12-04)
            self.baseline = self.baseline or {"score": self.best["score"], "eval": self.best["eval"]}
            self.best = None
        return True

    def use_best(self) -> int | None:
        """Load the weights of the best held-out evaluation into the drafter; returns its step (None: no eval)."""
        if self.best is None:
            return None
        self._load_weights(self.best["weights"])
        return self.best["step"]

    def _load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy saved trainable weights (CPU tensors by parameter name) into the drafter."""
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(weights[n].to(p.device))
