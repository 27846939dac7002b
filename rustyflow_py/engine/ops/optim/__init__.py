"""The optimizers' update kernels over the flat parameter buffer: the reference, CPU and CUDA
classes of every algorithm (reference.py, cpu.py, cuda.py), and one .cu file per
algorithm."""
