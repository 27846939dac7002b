"""The optimizers' update kernels over the flat parameter buffer (one .cu file per optimizer)."""
