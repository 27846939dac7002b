"""Elementwise arithmetic with broadcasting, and unbroadcast for its gradients; the add
kernel (a vector kernel on the GPU)."""
