"""SimPy discrete-event simulator of disaggregated RL pipelines (see sim/simulator.py)."""
