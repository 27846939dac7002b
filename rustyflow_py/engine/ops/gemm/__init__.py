"""GEMMs: matmul, the bias gradients' column sums, and the Linear / MLP layers whose bias,
GELU and bias gradients a backend fuses into the GEMMs (cuBLAS and cuBLASLt on the GPU)."""
