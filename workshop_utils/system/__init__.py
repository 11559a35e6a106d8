"""The system underneath: errors, the hardware and its peaks, cpu/gpu profiles, run folders and records.

Depends on nothing else in the package; everything else may depend on it.
"""
