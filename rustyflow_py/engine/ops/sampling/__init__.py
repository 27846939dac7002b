"""Choosing the next token from logits: greedy (argmax) and a draw with temperature, top-k
and top-p."""
