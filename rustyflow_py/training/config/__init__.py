"""How a run is configured: the config file and its keys, the run policy, the optimizer a config
names.
"""
