"""The machine a run executes on: device selection (`devices`), tf.distribute strategies
(`distribute`), `--mixed-precision auto` / `--xla auto` (`precision`), saved-artifact loading
(`artifacts`), faults and signal handling (`faults`), the run-directory lock (`runlock`) and
FLOP counts and peak probes (`flops`).

May import `base` only.
"""
