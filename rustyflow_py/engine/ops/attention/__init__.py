"""Causal self-attention: the materialised path's fused softmax, the GPU's flash-style fused
attention, and attention over a KV cache for generation."""
