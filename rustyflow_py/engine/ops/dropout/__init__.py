"""Dropout: Philox4x32-10 masks drawn from (seed, call site, device step), and the op."""
