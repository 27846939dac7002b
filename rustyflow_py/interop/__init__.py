"""Models in and out of rustyflow: GPT-2 checkpoints in Hugging Face's format.

rustyflow's GPT is GPT-2's architecture under GPT-2's parameter names, so moving weights is a
renaming plus checks: every setting of the other side's config either maps onto rustyflow's
model or is refused by name, never silently dropped.
"""
