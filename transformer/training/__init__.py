"""Training: `trainer.train(config)` runs a whole run (device, data, tokenizers, model, fit,
reports, checkpoints); `auto_batch` retries with smaller batches on out-of-memory; the fit's
callbacks (timing, budget, progress, backups, validation BLEU, profiling, TensorBoard) and the
training datasets (`training_data`).

May import every sub-package except `commands`.
"""
