"""Speculative decoding (issue 18): drafts proposed cheaply on the host, verified by the target
model in one decode step (each draft token one row; scheduler/speculation.py)."""
