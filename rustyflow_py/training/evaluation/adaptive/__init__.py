"""Evaluation-time adaptation (`rustyflow eval --adapt cache|dynamic`): perplexity of a
checkpoint that adapts to the text while it reads it, reported beside the model alone.

- cache.py: the neural cache pointer (Grave et al., 2017), a mixture with the recent text.
- dynamic.py: dynamic evaluation (Krause et al., 2018), gradient steps on the text as read.
- run.py: the command's work, the two numbers side by side, and their lines.
- ranges.py: the hyperparameters' range checks, shared by both.

Both score every token before anything is learned from it, so the numbers are honest
perplexities of an online predictor; they are never the model-only number, which stays the
`perplexity` of evaluate.py on the same windows.
"""
