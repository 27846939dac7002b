"""Elementwise arithmetic with broadcasting, and unbroadcast for its gradients."""
