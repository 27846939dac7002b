"""FP8 (Hopper's e4m3 and e5m2): the formats and their scaling recipe (formats.py), the
kernels that find a tensor's amax and quantise it (cuda.py, fp8_cast.cu)."""
