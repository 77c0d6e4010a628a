"""Decisions shared by the simulator and the live runtime.

Pure Python (no simpy, torch, vLLM or HTTP): typed records, the run spec, the policy
registries, the pipeline-mode controllers and the one builder (``policies.build``) both
executors call. The controllers and policies do no I/O; the edges of the package do, on
request: ``policies.spec`` reads YAML specs, ``policies.calibrated`` reads a saved
``cost_model.json`` and ``policies.results`` writes and reads a run's result files.
"""
