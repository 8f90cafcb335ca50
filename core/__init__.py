"""The leaf layer: the config schema and the types every other layer hands to the next.

Imports nothing of hbmserve (tests/unit/test_layers.py checks it). Brains, adapters, the CLI
and ops import down into it; it never imports up.
"""
