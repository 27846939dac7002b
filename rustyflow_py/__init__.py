"""RustyFlow: a from-scratch GPT trainer on NumPy (CPU) or CuPy (GPU) with a per-op profiler."""

__version__ = "0.2.0"
