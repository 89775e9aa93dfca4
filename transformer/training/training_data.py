"""The datasets one training run consumes: global batches for the strategy, input sharded.

`make_datasets` builds (training, validation) from the corpus with the configured pipeline
(transformer/data/pipeline.py); under `--strategy tpu` it builds static-shape batches instead
(`distribute.tpu_batches`: XLA on TPU compiles one program per shape). `count_batches` is
the length of one training epoch (the cosine schedule's planned steps).

`fit` reads one repeated training dataset, `epoch_steps` batches per epoch (counted once
when the user gave no `--steps-per-epoch`). Given a dataset of unknown length instead, Keras
opens a new iterator every epoch and one more at each epoch's end; 30-minute runs fed that
way lost 17-58 s at the start of several epochs, between steps (deleting an iterator read
for minutes can block that long); with one iterator the overhead is 1-3 s per epoch
(docs/recipes.md, *Wall time of a 30-minute budget*).
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from transformer.base.config import AUTO, RECIPE_MAX_TOKENS, RunConfig
from transformer.base.errors import InputError
from transformer.data.pipeline import (
    length_grid,
    make_batches,
    pair_ids,
    resolve_length_buckets,
    tokenize_mixture,
    tokenize_pairs,
)
from transformer.runtime import distribute
from transformer.runtime.precision import XlaWorkload


def tokenized_training_pairs(corpus, tokenizers, config: RunConfig):
    """The training pairs tokenized once: their ids in memory (`pipeline.pair_ids`), or with a
    file cache, subword sampling or `--training-batches streamed` a cached stream
    (`pipeline.tokenize_pairs`); None when naive.

    Shared by `count_batches` and `make_datasets`, so that counting the batches of an epoch
    fills the cache the training pipeline then reads (the split is tokenized once, not twice;
    with subword sampling the cache holds the strings and every pass tokenizes anew).
    A mixture gives its per-part caches, mixed afresh on every pass. None for the naive
    pipeline (it tokenizes every batch).
    """
    if config.pipeline.kind != "optimized":
        return None
    pairs = corpus.training_pairs
    planned = config.pipeline.training_batches == "planned"
    if planned and config.pipeline.cache == "memory" and config.pipeline.sampling is None:
        return pair_ids(pairs, tokenizers, config.model.max_length)  # training batches planned per epoch
    if pairs is corpus.train:
        return tokenize_pairs(pairs, tokenizers, config.model.max_length, config.pipeline.cache,
                              config.pipeline.sampling)
    return tokenize_mixture(pairs, tokenizers, config.pipeline, config.model.max_length, config.train.seed)


def count_batches(corpus, tokenizers, config: RunConfig, replicas: int = 1, tokenized=None) -> int:
    """Training batches in one epoch of the configured pipeline (one pass over the cached ids).

    `tokenized`: `tokenized_training_pairs(...)`, to fill the cache the training then reuses.
    """
    if tokenized is None:
        tokenized = tokenized_training_pairs(corpus, tokenizers, config)
    batches = make_batches(corpus.training_pairs, tokenizers, config.pipeline, config.model.max_length,
                           training=True, seed=config.train.seed, replicas=update_rows(config, replicas),
                           tokenized=tokenized)
    return dataset_length(batches)


def dataset_length(batches: tf.data.Dataset) -> int:
    """Elements of a finite dataset, counted by one pass over it."""
    return int(batches.reduce(0, lambda count, _: count + 1).numpy())


def update_rows(config: RunConfig, replicas: int) -> int:
    """The multiple of the configured batch one training step reads: `replicas` (a global batch) ×
    `--accumulate-steps` (the micro-batches of one update, transformer/model/accumulation.py)."""
    return replicas * config.train.accumulate_steps


def epoch_steps(corpus, tokenizers, config: RunConfig, strategy_name: str, replicas: int = 1,
                tokenized=None) -> Optional[int]:
    """Batches per `fit` epoch: `--steps-per-epoch`, else one counted pass; None on TPU.

    TPU batches are one fixed epoch of static shapes, read to its end as before.
    """
    if config.train.steps_per_epoch:
        return config.train.steps_per_epoch
    if strategy_name == "tpu":
        return None
    return count_batches(corpus, tokenizers, config, replicas, tokenized)


def no_batches_error(corpus, config: RunConfig, replicas: int = 1) -> InputError:
    """The error of a training split that fills no training batch (each length bucket keeps only
    full batches, so a split smaller than one batch per bucket trains nothing)."""
    pipeline = config.pipeline
    batch = (f"{pipeline.max_tokens} tokens per batch (--max-tokens)" if pipeline.kind == "optimized" and pipeline.max_tokens
             else f"{pipeline.batch_size} sentences per batch (--batch-size)")
    rows = update_rows(config, replicas)
    if rows > 1:
        batch += f" × {rows} (replicas × --accumulate-steps)"
    return InputError(f"the training split of {corpus.name} ({corpus.num_train} pairs) fills no training batch of "
                      f"{batch}: a length bucket trains only full batches",
                      hint="lower --max-tokens (or --batch-size), or train on more pairs")


def xla_workload(config: RunConfig, steps_per_epoch: Optional[int], validation: bool,
                 compile_threads: int = 1) -> XlaWorkload:
    """What the run would compile with XLA and how long it trains (`precision.XlaWorkload`).

    Programs: one per length of the XLA grid for the train step, as many again for the
    evaluation step when `fit` validates (a validation split and no budgeted BLEU evaluation,
    which measures the loss itself, uncompiled). Steps: `planned_steps`, else planned epochs ×
    `steps_per_epoch` (None: unknown). Under a time budget, the budget. `compile_threads`: programs
    the XLA warm-up compiles at once (1: none, each compiled when its shape first comes).
    """
    train = config.train
    budget_s = train.time_budget_minutes * 60 if train.time_budget_minutes is not None else None
    shapes = len(length_grid(resolve_length_buckets(config.pipeline, True), config.model.max_length))
    fit_validates = validation and not (budget_s is not None and train.bleu_sentences)
    steps = train.planned_steps
    if steps is None and budget_s is None and steps_per_epoch is not None:
        steps = train.planned_epochs * steps_per_epoch
    tokens = config.pipeline.max_tokens or config.pipeline.batch_size * config.model.max_length
    if tokens == AUTO:  # not resolved yet (training resolves the batch first): the recipe's
        tokens = RECIPE_MAX_TOKENS
    return XlaWorkload(programs=shapes * (2 if fit_validates else 1), budget_s=budget_s, steps=steps,
                       tokens_per_batch=tokens, compile_threads=compile_threads if train.xla_warmup else 1)


def make_datasets(corpus, tokenizers, config: RunConfig, strategy_name: str, replicas: int, tokenized=None,
                  repeat: Optional[bool] = None, validation: bool = True):
    """(training, validation or None) datasets of global batches, auto-shard policy set.

    The validation batches are the split's first `--validation-steps` batches (all without it),
    read from the start at every evaluation.

    `tokenized`: `tokenized_training_pairs(...)` built before (e.g. by `count_batches`), or None.
    `repeat`: the training batches repeat without end (`fit` then needs `steps_per_epoch`);
    None: only when `--steps-per-epoch` is set.
    `validation`: False gives no validation batches (e.g. `fit` does not validate), so none are counted.
    """
    max_length = config.model.max_length
    if strategy_name == "tpu":
        pipeline = config.pipeline
        per_replica = (pipeline.max_tokens // max_length if pipeline.kind == "optimized" and pipeline.max_tokens
                       else pipeline.batch_size)
        def batches(pairs, training):
            batch = max(1, per_replica) * (update_rows(config, replicas) if training else replicas)
            tokenized = (tokenize_pairs(pairs, tokenizers, max_length, pipeline.cache, pipeline.sampling) if training
                         else tokenize_pairs(pairs, tokenizers, max_length))
            return distribute.tpu_batches(tokenized, batch, max_length, training, pipeline.shuffle_buffer,
                                          config.train.seed)
    else:
        if tokenized is None:
            tokenized = tokenized_training_pairs(corpus, tokenizers, config)

        def batches(pairs, training):
            return make_batches(pairs, tokenizers, config.pipeline, max_length, training=training,
                                seed=config.train.seed if training else None,
                                replicas=update_rows(config, replicas) if training else replicas,
                                tokenized=tokenized if training else None)

    train_pairs = corpus.train if strategy_name == "tpu" else corpus.training_pairs  # TPU: one fixed epoch
    train_batches = distribute.shard_input(batches(train_pairs, True))
    if repeat if repeat is not None else bool(config.train.steps_per_epoch):
        train_batches = train_batches.repeat()
    val_batches = None
    if validation and corpus.validation is not None:
        val_batches = validation_batches(distribute.shard_input(batches(corpus.validation, False)),
                                         config.train.validation_steps)
    return train_batches, val_batches


def validation_batches(batches: tf.data.Dataset, steps: Optional[int]) -> tf.data.Dataset:
    """The first `steps` of `batches` (all when None), with their count as the dataset's cardinality.

    The same batches at every evaluation, so validation losses compare across epochs
    (`fit(validation_steps=N)` would read the next N from one iterator kept across epochs, and
    under a distribution strategy end with a bare StopIteration once it ran out). The count
    (one pass, which fills the tokenized split's cache) lets Keras end each evaluation without
    its "ran out of data; interrupting training" warning.
    """
    if steps:
        batches = batches.take(steps)
    count = int(batches.cardinality().numpy())
    if count < 0:  # unknown (length-bucketed batches)
        count = dataset_length(batches)
    return batches.apply(tf.data.experimental.assert_cardinality(count))
