"""Scheduling: requests, the block manager and the scheduler. Pure Python: never imports torch."""
