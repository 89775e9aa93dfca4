"""Measurement that outlives a run: the machine's environment (`environment`), per-step
records and summaries (`step_stats`), the step-time report files (`reports`), comparing
reports (`compare`), the benchmark matrix (`benchmark`) and attention plots.

May import `runtime` and `base`.
"""
