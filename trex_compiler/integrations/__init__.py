"""Adapters between trex and the model libraries it captures."""
