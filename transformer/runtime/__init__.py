"""The machine a run executes on: device selection (`devices`), tf.distribute strategies
(`distribute`), `--mixed-precision auto` / `--xla auto` (`precision`), saved-artifact loading
(`artifacts`), faults and signal handling (`faults`), the run-directory lock (`runlock`), the
tf.data options of every input pipeline (`tfdata`) and FLOP counts and peak probes (`flops`).

May import `base` only.
"""
