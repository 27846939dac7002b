"""What a run leaves on disk, and when: the claim on its outputs, checkpoints, the log block, the
run record, atomic writes.
"""
