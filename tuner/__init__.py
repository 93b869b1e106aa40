"""Search and measure: Optuna studies over the kernel families, measured on a GPU.

Entry point: ``python -m tuner`` (see ``tuner.cli``).
"""
