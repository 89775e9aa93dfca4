"""The training foundation on real data: input pipelines, overfitting a handful of pairs,
`train()` end to end, resume and the refusal to overwrite a run."""

import collections
import dataclasses
import json
import shutil
import warnings

import keras
import numpy as np
import pytest
from conftest import run_config, tokenizers_reused

from transformer.base.config import ModelConfig, PipelineConfig, RunConfig
from transformer.base.constants import END_ID, PAD_ID, START_ID
from transformer.data.pipeline import bucket_boundaries, make_batches, padded_lengths
from transformer.inference.rundir import CONFIG_FILE, build_model, load_trained_model
from transformer.model.optimizer import compile_model
from transformer.runtime.fused_kernels import active_kernels
from transformer.training.trainer import train

MAX_LENGTH = 20  # deliberately not a multiple of the bucket width (8)


def rows(ids: np.ndarray) -> list:
    """Each row without its trailing padding, as a tuple."""
    return [tuple(int(i) for i in row[row != PAD_ID]) for row in ids]


def expected_pairs(built, pairs, max_length):
    src = built.tokenizers.src.tokenize([s for s, _ in pairs]).to_list()
    tgt = built.tokenizers.tgt.tokenize([t for _, t in pairs]).to_list()
    return [(tuple(s[:max_length]), tuple(t[: max_length + 1])) for s, t in zip(src, tgt)]


def batches_as_pairs(batches) -> list:
    """((src, tgt_in), tgt_out) batches → [(src ids, full target ids)] after checking the shift."""
    out = []
    for (src, tgt_in), tgt_out in batches.as_numpy_iterator():
        assert src.dtype == tgt_in.dtype == tgt_out.dtype == np.int32
        assert tgt_in.shape == tgt_out.shape and src.shape[0] == tgt_in.shape[0]
        assert (src[:, 0] == START_ID).all() and (tgt_in[:, 0] == START_ID).all()
        assert (tgt_in[tgt_out != PAD_ID] != PAD_ID).all()  # a real input wherever a loss is taken
        for s, ti, to in zip(rows(src), rows(tgt_in), rows(tgt_out)):
            target = ti[:1] + to  # [START] + tgt_out
            # tgt_in is the target shifted right; it may also carry [END] at a position whose
            # tgt_out is padding (the naive pipeline splits after padding).
            assert ti == target[: len(ti)] and len(ti) in (len(to), len(to) + 1)
            out.append((s, target))
    return out


@pytest.fixture(scope="module")
def val_pairs(bible_tokenizers):
    return [(s.decode(), t.decode()) for s, t in bible_tokenizers.corpus.validation.as_numpy_iterator()]


@pytest.mark.parametrize("kind", ["naive", "optimized"])
def test_pipelines_keep_every_pair_with_the_expected_layout(bible_tokenizers, val_pairs, kind):
    config = PipelineConfig(kind=kind, batch_size=16, max_tokens=200)
    batches = make_batches(bible_tokenizers.corpus.validation, bible_tokenizers.tokenizers, config, MAX_LENGTH,
                           training=False)
    assert batches.element_spec[0][0].shape.as_list() == [None, None]
    got = batches_as_pairs(batches)
    expected = expected_pairs(bible_tokenizers, val_pairs, MAX_LENGTH)
    assert collections.Counter(got) == collections.Counter(expected)  # nothing lost, added or altered
    assert all(len(s) <= MAX_LENGTH and len(t) <= MAX_LENGTH + 1 for s, t in got)
    assert any(t[-1] != END_ID for _, t in got)  # some targets were truncated...
    assert any(t[-1] == END_ID for _, t in got)  # ...and some were not


def test_optimized_batches_use_bounded_shapes_and_the_token_budget(bible_tokenizers):
    max_tokens = 160
    config = PipelineConfig(kind="optimized", max_tokens=max_tokens, bucket_width=8)
    allowed = padded_lengths(MAX_LENGTH, 8)
    assert allowed == [8, 16, 20]
    assert bucket_boundaries(MAX_LENGTH, 8) == [9, 17, 21]
    pairs = bible_tokenizers.corpus.train.take(400)
    shapes = collections.Counter()
    for (src, tgt_in), tgt_out in make_batches(pairs, bible_tokenizers.tokenizers, config, MAX_LENGTH,
                                               training=True, seed=0).as_numpy_iterator():
        batch, length = src.shape
        assert length in allowed and tgt_in.shape == tgt_out.shape == (batch, length)
        assert batch == max_tokens // length  # training drops remainders: fixed batch per bucket
        assert batch * length <= max_tokens
        assert (src[:, 0] == START_ID).all() and (tgt_in[:, 0] == START_ID).all()
        shapes[src.shape] += 1
    assert len(shapes) >= 2  # several buckets were used


def test_optimized_batches_fit_the_model(bible_tokenizers, tiny_model_config):
    """Every padded batch must fit the position table (max_length) of the model."""
    config = PipelineConfig(kind="optimized", max_tokens=300)
    model_config = tiny_model_config(num_layers=1, max_length=MAX_LENGTH,
                                     src_vocab_size=int(bible_tokenizers.tokenizers.src.get_vocab_size()),
                                     tgt_vocab_size=int(bible_tokenizers.tokenizers.tgt.get_vocab_size()))
    model = build_model(model_config)
    batches = make_batches(bible_tokenizers.corpus.train.take(200), bible_tokenizers.tokenizers, config,
                           MAX_LENGTH, training=False)
    for (src, tgt_in), tgt_out in batches:
        logits = model((src, tgt_in))
        assert logits.shape == (*tgt_out.shape, model_config.tgt_vocab_size)


def test_sentence_batches_when_no_token_budget(bible_tokenizers):
    config = PipelineConfig(kind="optimized", max_tokens=None, batch_size=7)
    batches = make_batches(bible_tokenizers.corpus.train.take(100), bible_tokenizers.tokenizers, config,
                           MAX_LENGTH, training=True, seed=1)
    sizes = {src.shape[0] for (src, _), _ in batches.as_numpy_iterator()}
    assert sizes == {7}


def test_tiny_model_overfits_a_handful_of_pairs(bible_tokenizers, tiny_model_config):
    tokenizers = bible_tokenizers.tokenizers
    pairs = bible_tokenizers.corpus.train.take(8)
    (src, tgt_in), tgt_out = next(iter(make_batches(pairs, tokenizers, PipelineConfig(kind="naive", batch_size=8),
                                                    32, training=False)))
    assert src.shape[0] == 8
    model_config = tiny_model_config(num_layers=1, d_model=32, dff=64, max_length=32,
                                     src_vocab_size=int(tokenizers.src.get_vocab_size()),
                                     tgt_vocab_size=int(tokenizers.tgt.get_vocab_size()))
    keras.utils.set_random_seed(0)
    model = build_model(model_config)
    compile_model(model, RunConfig().replace(train={"lr_schedule": "inverse-sqrt", "peak_learning_rate": None,
                                                "warmup_steps": 30, "label_smoothing": 0.0}))  # the training path's optimizer
    losses = []
    for _ in range(80):
        loss, accuracy = model.train_on_batch((src, tgt_in), tgt_out)
        losses.append(float(loss))
        if losses[-1] < 0.1 * losses[0]:
            break
    assert losses[0] > 0.8 * np.log(model_config.tgt_vocab_size)  # starts near chance
    assert losses[-1] < 0.3 * losses[0], losses
    assert float(accuracy) > 0.8


EPOCHS, STEPS = 2, 3


@pytest.fixture(scope="module")
def fresh_run(bible_tokenizers, tmp_path_factory):
    """One fresh `train()` run of EPOCHS × STEPS steps with validation (shared: it is the slow part),
    with the Python warnings it issued."""
    output = tmp_path_factory.mktemp("fresh") / "run"
    config = run_config(bible_tokenizers, output, epochs=EPOCHS, steps_per_epoch=STEPS)
    with tokenizers_reused(bible_tokenizers), warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        result = train(config)
    return config, result, output, [str(w.message) for w in issued]


def test_train_end_to_end_writes_a_complete_run(bible_tokenizers, fresh_run):
    config, result, output, issued = fresh_run
    # Keras warns of neither a shuffle it ignores nor an input that "ran out of data; interrupting
    # training" (the validation batches are counted; the training batches repeat).
    assert not [w for w in issued if "ran out of data" in w or "shuffle" in w], issued
    saved = RunConfig.load(output / CONFIG_FILE)
    vocab = (int(bible_tokenizers.tokenizers.src.get_vocab_size()), int(bible_tokenizers.tokenizers.tgt.get_vocab_size()))
    assert (saved.model.src_vocab_size, saved.model.tgt_vocab_size) == vocab
    assert config.pipeline.length_buckets == "auto" and saved.pipeline.length_buckets == "width"  # resolved: no XLA
    resolved = dataclasses.replace(config.train, lr_scaling="off", lr_batch_factor=1.0)  # the schedule as used
    assert saved == config.replace(model=saved.model, pipeline={"length_buckets": "width"}, train=resolved)
    assert result.tokenizer_dir == output / "tokenizers"
    assert (output / "tokenizers" / "saved_model.pb").is_file()
    assert (output / "tokenizers" / "manifest.json").read_text() == \
        (bible_tokenizers.directory / "manifest.json").read_text()
    assert (output / "checkpoints" / "checkpoint").is_file()
    assert list((output / "tensorboard").rglob("events.out.tfevents.*"))

    report = json.loads((output / "report.json").read_text())
    assert report["state"] == "completed" and report["error"] is None
    assert report["steps_done"] == report["steps_planned"] == EPOCHS * STEPS
    kernels = report["run"]["fused_kernels"]  # --fused-kernels auto on CPU: on where g++ builds them, else why not
    assert kernels["asked"] == "auto" and (kernels["enabled"] or kernels["reason"])
    assert active_kernels() is None  # off again after train(): a caller's later XLA step traces TF's ops
    compiled = report["compile"]  # without XLA: the shapes met, no compilation, one trace per step function
    assert compiled["xla"] is False and compiled["persistent_cache"] is None
    assert compiled["length_grid"] == padded_lengths(config.model.max_length, config.pipeline.bucket_width)
    for step in ("train", "evaluate"):
        assert compiled[step]["compilations"] == 0 and compiled[step]["traces"] == 1
        assert all(length in compiled["length_grid"] for _, length, _ in compiled[step]["shapes"])
    summary = json.loads((output / "summary.json").read_text())
    assert summary["epochs_run"] == EPOCHS and summary["optimizer_steps"] == EPOCHS * STEPS
    assert 0.0 <= summary["val_masked_accuracy"] <= 1.0
    assert np.isfinite(summary["train_loss"]) and np.isfinite(summary["val_loss"])
    assert len(result.history["loss"]) == EPOCHS

    # The run directory alone restores the trained model.
    model, tokenizers, restored_config = load_trained_model(output)
    assert restored_config.model == saved.model
    src = tokenizers.src.tokenize(["No princípio."]).to_tensor()
    tgt = tokenizers.tgt.tokenize(["In the beginning."]).to_tensor()[:, :-1]
    np.testing.assert_allclose(model((src, tgt)).numpy(), result.model((src, tgt)).numpy(), atol=1e-6)


def test_resume_continues_the_step_count(bible_tokenizers, fresh_run, tmp_path):
    """Resuming the fresh run (EPOCHS epochs done) for one more epoch continues its step count."""
    _, first, fresh_output, _ = fresh_run
    output = tmp_path / "run"
    shutil.copytree(fresh_output, output)  # leave the shared run untouched
    first_weights = [w.numpy() for w in first.model.weights]

    # Without --resume the run directory is protected...
    before = (output / CONFIG_FILE).read_text()
    with pytest.raises(FileExistsError, match="--resume"):
        train(run_config(bible_tokenizers, output, epochs=EPOCHS + 1, steps_per_epoch=STEPS))
    assert (output / CONFIG_FILE).read_text() == before

    # ...with it, training continues from the checkpoint, on the saved architecture and the run's
    # own tokenizers even when the command line says otherwise (another --vocab-size would learn
    # other ids: the embeddings would be indexed out of range). No validation: not tested here.
    changed = run_config(bible_tokenizers, output, validation=False, epochs=EPOCHS + 1, steps_per_epoch=STEPS,
                         resume=True)
    with tokenizers_reused(bible_tokenizers):
        second = train(changed.replace(model={"d_model": 32},
                                       tokenizer={"vocab_size": bible_tokenizers.config.vocab_size + 100}))
    assert RunConfig.load(output / CONFIG_FILE).tokenizer == bible_tokenizers.config
    assert second.summary["initial_epoch"] == EPOCHS
    assert second.summary["epochs_run"] == 1
    assert second.summary["optimizer_steps"] == (EPOCHS + 1) * STEPS
    assert int(second.model.optimizer.iterations.numpy()) == (EPOCHS + 1) * STEPS
    assert second.model.config.d_model == 16
    # The step-time report continues the first attempt's rows instead of overwriting them.
    report = json.loads((output / "report.json").read_text())
    assert report["steps_done"] == (EPOCHS + 1) * STEPS and report["state"] == "completed"
    assert [a["state"] for a in report["run"]["attempts"]] == ["completed"]
    steps = [int(line.split(",")[0]) for line in (output / "report_steps.csv").read_text().splitlines()[1:]]
    assert steps == list(range((EPOCHS + 1) * STEPS))
    assert any(not np.array_equal(a, b.numpy()) for a, b in zip(first_weights, second.model.weights))


def test_checkpoint_restore_gives_back_the_weights(bible_tokenizers, tmp_path):
    """RunCheckpoints round trip without fitting: restored weights and step equal the saved ones."""
    from transformer.inference.rundir import RunCheckpoints

    config = run_config(bible_tokenizers, tmp_path)
    model_config = ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, max_length=16,
                               src_vocab_size=30, tgt_vocab_size=30)
    keras.utils.set_random_seed(1)
    model = build_model(model_config)
    optimizer = compile_model(model, config)
    optimizer.iterations.assign(17)
    RunCheckpoints(tmp_path / "ckpt", model, optimizer).save(epoch=4)

    keras.utils.set_random_seed(2)
    other = build_model(model_config)
    other_optimizer = compile_model(other, config)
    checkpoints = RunCheckpoints(tmp_path / "ckpt", other, other_optimizer)
    assert checkpoints.restore_latest() is not None
    assert int(checkpoints.epoch.numpy()) == 4 and int(other_optimizer.iterations.numpy()) == 17
    for a, b in zip(model.weights, other.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_counting_batches_shares_the_tokenized_cache_with_training(bible_tokenizers, tmp_path):
    """count_batches (the cosine schedule's planned steps) fills the cache the training pipeline
    reads: the same batches, in the same order, as a pipeline that tokenizes for itself."""
    from transformer.training.training_data import count_batches, make_datasets, tokenized_training_pairs

    config = run_config(bible_tokenizers, tmp_path / "run", steps_per_epoch=None)
    corpus, tokenizers = bible_tokenizers.corpus, bible_tokenizers.tokenizers
    tokenized = tokenized_training_pairs(corpus, tokenizers, config)
    assert tokenized is not None
    planned = count_batches(corpus, tokenizers, config, 1, tokenized)
    shared, _ = make_datasets(corpus, tokenizers, config, "default", 1, tokenized=tokenized)
    alone, _ = make_datasets(corpus, tokenizers, config, "default", 1)
    shared, alone = list(shared.as_numpy_iterator()), list(alone.as_numpy_iterator())
    assert len(shared) == len(alone) == planned
    for (a_in, a_out), (b_in, b_out) in zip(shared, alone):
        np.testing.assert_array_equal(a_in[0], b_in[0])
        np.testing.assert_array_equal(a_out, b_out)
    naive = dataclasses.replace(config, pipeline=dataclasses.replace(config.pipeline, kind="naive"))
    assert tokenized_training_pairs(corpus, tokenizers, naive) is None  # tokenizes per batch


def test_every_input_pipeline_runs_without_the_autotuning_thread(bible_tokenizers, tmp_path):
    """Dropping an iterator whose tf.data autotuning thread is asleep can stop the whole process
    for up to 60 s (transformer/runtime/tfdata.py). Every pipeline training reads has the thread
    off, through the trainer's own wrappers (sharding options, validation's take + cardinality):
    streamed and planned training batches, the naive pipeline, TPU batches."""
    import tensorflow as tf

    from transformer.data.epoch_plan import PairIds
    from transformer.data.pipeline import tokenize_pairs
    from transformer.runtime import distribute
    from transformer.training.training_data import make_datasets, tokenized_training_pairs

    corpus, tokenizers = bible_tokenizers.corpus, bible_tokenizers.tokenizers
    pipelines, forms = {}, set()
    for kind, batches in (("naive", "planned"), ("optimized", "planned"), ("optimized", "streamed")):
        config = run_config(bible_tokenizers, tmp_path / kind, steps_per_epoch=None)
        config = config.replace(pipeline={"kind": kind, "training_batches": batches})
        tokenized = tokenized_training_pairs(corpus, tokenizers, config)
        forms.add("naive" if tokenized is None else "planned" if isinstance(tokenized, PairIds) else
                  "streamed" if isinstance(tokenized, tf.data.Dataset) else repr(tokenized))
        pipelines[f"{kind} {batches}: train"], pipelines[f"{kind} {batches}: validation"] = make_datasets(
            corpus, tokenizers, config, "default", 1, tokenized=tokenized)
    assert forms == {"naive", "planned", "streamed"}, forms
    pipelines["tpu"] = distribute.tpu_batches(tokenize_pairs(corpus.validation, tokenizers, 16), 4, 16, False)
    for name, dataset in pipelines.items():
        assert dataset.options().autotune.enabled is False, name
    assert tf.data.Dataset.range(3).options().autotune.enabled is not False  # tf.data's own default: on


def test_fit_reads_one_training_iterator_for_the_whole_run(bible_tokenizers, tmp_path, monkeypatch):
    """Without --steps-per-epoch an epoch is one counted pass of a repeated dataset: Keras opens
    one training iterator for the run (given a dataset of unknown length it opens a new one
    every epoch and one more at each epoch's end), never runs out of data, and the report
    plans exactly the steps it then does."""
    import warnings

    import tensorflow as tf

    from transformer.training.training_data import count_batches, tokenized_training_pairs

    opened = []
    original_iter = tf.data.Dataset.__iter__

    def counting_iter(dataset):
        if int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
            opened.append(dataset)
        return original_iter(dataset)

    monkeypatch.setattr(tf.data.Dataset, "__iter__", counting_iter)
    config = run_config(bible_tokenizers, tmp_path / "run", validation=False, epochs=2, steps_per_epoch=None)
    config = config.replace(pipeline={"max_tokens": 4096})  # fewer, larger batches: fewer steps to run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(config)
    corpus, tokenizers = bible_tokenizers.corpus, bible_tokenizers.tokenizers
    per_epoch = count_batches(corpus, tokenizers, config, 1, tokenized_training_pairs(corpus, tokenizers, config))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["steps_done"] == report["steps_planned"] == 2 * per_epoch
    assert len(opened) == 1
    assert not [w for w in caught if "ran out of data" in str(w.message)]


@pytest.mark.parametrize("steps_per_epoch", [None, 3], ids=["counted", "steps-per-epoch"])
def test_a_split_that_fills_no_batch_is_an_error_not_an_empty_run(bible_tokenizers, tmp_path, steps_per_epoch):
    """Each length bucket trains only full batches: a split too small for one batch of the budget
    trains nothing. Counted (before any step) or seen after `fit` (--steps-per-epoch), it is an
    error naming the flag, and the report says so; not a "completed" run of an untrained model."""
    from transformer.base.errors import InputError

    output = tmp_path / "run"
    config = run_config(bible_tokenizers, output, validation=False, steps_per_epoch=steps_per_epoch)
    config = config.replace(pipeline={"max_tokens": 1 << 20})  # 32,768 rows at length 32: more than the split
    with tokenizers_reused(bible_tokenizers), pytest.raises(InputError, match=r"fills no training batch.*--max-tokens"):
        train(config)
    report = json.loads((output / "report.json").read_text())
    assert report["state"] == "crashed" and "fills no training batch" in report["error"]["message"]
    assert report["steps_done"] == 0


def test_accumulated_steps_are_updates_of_n_micro_batches(bible_tokenizers, tmp_path):
    """--accumulate-steps 2: three fit steps = three optimizer updates, each reading two micro-batches
    (the report's steps are updates; their examples are those of both micro-batches)."""
    results = {n: train(run_config(bible_tokenizers, tmp_path / f"n{n}", validation=False, epochs=1,
                                   steps_per_epoch=STEPS, accumulate_steps=n)) for n in (1, 2)}
    for n, result in results.items():
        assert result.summary["optimizer_steps"] == STEPS
        report = json.loads((tmp_path / f"n{n}" / "report.json").read_text())
        assert report["steps_done"] == STEPS
    assert "× 2 micro-batches per update" in report["run"]["batching"]
    assert RunConfig.load(tmp_path / "n2" / CONFIG_FILE).train.accumulate_steps == 2
    # same buckets' rows doubled: twice the sentences per update (the buckets drawn differ a little)
    ratio = results[2].summary["tokens_seen"]["examples"] / results[1].summary["tokens_seen"]["examples"]
    assert 1.6 < ratio < 2.4, ratio
