"""The encoder-decoder Transformer (`transformer.Transformer`), its layers (`layers`, `tied`,
`dropout`, `layer_norm`), masked losses and metrics (`losses`), learning-rate schedules
(`schedule`) and the optimizer and compile step (`optimizer`).

Works on token ids: may import `data`, `measure`, `runtime` and `base`,
never tensorflow-text or the tokenizers (import-linter enforces it).
"""
