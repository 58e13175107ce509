"""The worker: runs a scheduled step on the device (inputs, forward, graphs, sampling)."""
