"""The TensorFlow-free base: command-line flags (`cli`), named presets, the typed run config
(`config`), constants, atomic file writes, the TF/tf-text version check, the error types and
the notebooks' setup (`notebook_setup`: Colab install, versions, paths).

Imports nothing from the package above it and no TensorFlow, Keras or tensorflow-text, so
flags parse and configs load in milliseconds (import-linter enforces both).
"""
