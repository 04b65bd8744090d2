"""Analytical models, no measurement: peak device memory of a ``generate()`` call (:mod:`.memory`) and whether a
benchmark row fits a GPU (:mod:`.memory_fit`), the bandwidth floor and the speedup it predicts (:mod:`.bandwidth`),
and the model shapes they and the benchmark use (:mod:`.shapes`).
"""
