"""The kernels behind the ops: one contract (contract.py), one array-API formulation shared by
NumPy and CuPy (reference.py), specialised for the CPU (cpu.py: multi-threaded passes) and the
GPU (cuda.py: CuPy kernels)."""
