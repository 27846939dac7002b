"""Fused kernels behind the ops: one array-API formulation (xp.py) shared by NumPy and CuPy,
specialised for the CPU (cpu.py: multi-threaded passes) and the GPU (cuda.py: CuPy kernels)."""
