"""Data movement on the device: the batch gather and the loss ring of a host-free step."""
