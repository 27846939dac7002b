"""Softmax cross-entropy, alone and fused with the tied LM head's GEMMs."""
