"""Whole training loops, one file per algorithm, readable top to bottom."""
