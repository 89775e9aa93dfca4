"""The datasets one training run consumes: global batches for the strategy, input sharded.

`make_datasets` builds (training, validation) from the corpus with the configured pipeline
(transformer/pipeline.py); under `--strategy tpu` it builds static-shape batches instead
(`distribute.tpu_batches`: XLA on TPU compiles one program per shape). `count_batches` is
the length of one training epoch (the cosine schedule's planned steps).
"""

from __future__ import annotations

from transformer import distribute
from transformer.config import RunConfig
from transformer.pipeline import make_batches, tokenize_pairs


def tokenized_training_pairs(corpus, tokenizers, config: RunConfig):
    """The training pairs tokenized and cached once (`pipeline.tokenize_pairs`), or None.

    Shared by `count_batches` and `make_datasets`, so that counting the batches of an epoch
    fills the cache the training pipeline then reads (the split is tokenized once, not twice).
    None when the pipeline tokenizes differently: naive (per batch) or a mixture (per part).
    """
    if config.pipeline.kind != "optimized" or corpus.training_pairs is not corpus.train:
        return None
    return tokenize_pairs(corpus.train, tokenizers, config.model.max_length, config.pipeline.cache)


def count_batches(corpus, tokenizers, config: RunConfig, replicas: int = 1, tokenized=None) -> int:
    """Training batches in one epoch of the configured pipeline (one pass over the cached ids).

    `tokenized`: `tokenized_training_pairs(...)`, to fill the cache the training then reuses.
    """
    batches = make_batches(corpus.train, tokenizers, config.pipeline, config.model.max_length, training=True,
                           seed=config.train.seed, replicas=replicas, tokenized=tokenized)
    return int(batches.reduce(0, lambda count, _: count + 1).numpy())


def make_datasets(corpus, tokenizers, config: RunConfig, strategy_name: str, replicas: int, tokenized=None):
    """(training, validation or None) datasets of global batches, auto-shard policy set.

    `tokenized`: `tokenized_training_pairs(...)` built before (e.g. by `count_batches`), or None.
    """
    max_length = config.model.max_length
    if strategy_name == "tpu":
        pipeline = config.pipeline
        per_replica = (pipeline.max_tokens // max_length if pipeline.kind == "optimized" and pipeline.max_tokens
                       else pipeline.batch_size)
        batch = max(1, per_replica) * replicas

        def batches(pairs, training):
            tokenized = tokenize_pairs(pairs, tokenizers, max_length, pipeline.cache if training else "memory")
            return distribute.tpu_batches(tokenized, batch, max_length, training, pipeline.shuffle_buffer,
                                          config.train.seed)
    else:
        def batches(pairs, training):
            return make_batches(pairs, tokenizers, config.pipeline, max_length, training=training,
                                seed=config.train.seed if training else None, replicas=replicas,
                                tokenized=tokenized if training else None)

    train_pairs = corpus.train if strategy_name == "tpu" else corpus.training_pairs  # TPU: one fixed epoch
    train_batches = distribute.shard_input(batches(train_pairs, True))
    if config.train.steps_per_epoch:
        train_batches = train_batches.repeat()
    val_batches = None
    if corpus.validation is not None:
        val_batches = distribute.shard_input(batches(corpus.validation, False))
    return train_batches, val_batches
