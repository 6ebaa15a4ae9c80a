"""The Qt-free core: scenario, engines, explanations, cost, presets, files.

NumPy only; torch is imported lazily inside the functions that need it.
"""
