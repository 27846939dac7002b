"""How a run is judged: perplexity over the splits, weight averaging, adaptive evaluation.
"""
