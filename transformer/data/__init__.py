"""Text to token-id batches: parallel corpora and their validation (`corpora`), weighted
corpus mixtures (`mixing`), the WordPiece learner (`wordpiece`) and tokenizers (`tokenizer`),
and the tf.data input pipelines (`pipeline`).

May import `measure`, `runtime` and `base`.
"""
