"""LayerNorm over the last axis: forward (y, mean, rstd) and backward (dx, dw, db)."""
