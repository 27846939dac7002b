"""Reshape, transpose, basic indexing and sums over axes: data movement without kernels."""
