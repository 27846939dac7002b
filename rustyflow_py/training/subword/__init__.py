"""Subword tokenizers (TOKENIZER=gpt2|bpe): the tokenizer, its cached token files, the corpus
it makes, and how generation reads and writes text through it. The word-level tokenizer stays
in `data/vocab.py`; nothing here runs unless a run asks for subwords."""
