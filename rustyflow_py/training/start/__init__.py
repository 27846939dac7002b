"""How a run starts from earlier work: resuming a checkpoint, initialising from one, sizing the
model to the device.
"""
