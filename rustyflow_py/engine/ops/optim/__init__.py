"""The optimizers' update kernels over the flat parameter buffer: one file per optimizer
(reference, CPU and CUDA classes) and one .cu file per optimizer."""
