"""How a run runs: its parts, the loop, the step, the clock, signals, the profile of the replayed
step.
"""
