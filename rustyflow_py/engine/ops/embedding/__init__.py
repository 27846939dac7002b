"""The embedding lookup and its row-sparse gradient's scatter-add."""
