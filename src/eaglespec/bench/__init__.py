"""Benchmarks and tuning (`eaglespec bench`, `eaglespec tune`), one noun per module:

datasets (prompt sets), random_model (random weights of a shape), drafters (oracle / random / folder), runs (one
configuration at one batch size), suite (baseline + configurations x batch sizes + peer), bandwidth (decode traffic,
device copy bandwidth), peer_hf (transformers' generate), report (JSON schema, Markdown, files), plot (PNG),
tune (grid and verdict), setup (command-line values -> model, prompts, configurations).
"""
