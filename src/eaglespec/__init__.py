"""eaglespec: EAGLE-3 speculative decoding for any target model, and the drafters it needs."""

__version__ = "0.1.0"
