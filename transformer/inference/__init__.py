"""Using a trained model: greedy and beam decoding (`decoding`), the strings-in/strings-out
`Translator` (`translator`), run directories and checkpoints (`rundir`), BLEU/chrF evaluation
(`evaluation`), the SavedModel export (`export`) and length-penalty tuning (`decode_tuning`).

May import `model`, `data`, `measure`, `runtime` and `base`.
"""
