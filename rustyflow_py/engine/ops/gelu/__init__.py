"""GELU (tanh approximation) with the preceding bias add fused in."""
