"""Decisions shared by the simulator and the live runtime: pure Python, no I/O."""
