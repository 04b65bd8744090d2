"""Analytical models, no measurement: peak device memory (:mod:`.memory`), the bandwidth floor and the speedup
it predicts (:mod:`.bandwidth`), and the random-weights model shapes they and the benchmark use (:mod:`.shapes`).
"""
