"""Portuguese→English Transformer NMT in TensorFlow / Keras, in layers (top imports bottom only):

    commands/   the programs: train, translate, evaluate, export, …
    training/   `trainer.train(config)`: the fit loop, its callbacks and training datasets
    inference/  decoding, the Translator, run directories, evaluation, export
    model/      the encoder-decoder Transformer, its layers, losses, schedules, optimizer
    data/       corpora, corpus mixtures, WordPiece tokenizers, the tf.data pipeline
    measure/    step-time reports, environment capture, report comparison, benchmarks
    runtime/    devices, distribution, precision, artifacts, faults, run locks, FLOP counts
    base/       TensorFlow-free: flags, presets, typed config, constants, atomic writes, errors

pyproject.toml's import-linter contracts enforce this picture (docs/architecture.md).
"""
