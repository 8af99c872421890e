"""Training EAGLE-3 drafters (REFERENCE.md §5; the recipe and its choices: docs/training.md).

conversations.py (read ShareGPT / OpenAI data) -> regenerate.py (the target answers) -> dataset.py (chat template,
assistant loss mask, batches) -> vocab.py (d2t / t2d) -> drafter.py (a fresh drafter) -> features.py + ttt.py (the
target's aux states and the unrolled training-time test) -> trainer.py (loop, checkpoints, eval) -> export.py (the
published checkpoint format). pipeline.py runs them in order; `eaglespec train` (cli/train.py) is its command line.
"""
