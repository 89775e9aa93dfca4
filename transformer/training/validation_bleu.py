"""`ValidationBleu`: sacrebleu BLEU/chrF (and validation loss) on a fixed sample while training.

When it evaluates: every `every_steps` optimizer steps; or, under a time budget, when the
clock's progress reaches each of `fractions` (default 0.5 and 0.8 of the budget: an early
model is not worth decoding, and an undertrained one decodes slowly, to the length limit)
and once when training ends; otherwise at each epoch end. It translates the sample with the
cached batched greedy `Translator` over the live model, scores it with sacrebleu
(`evaluation.score`), measures the masked loss and accuracy on `loss_batches` (the same
sample, batched) if given, and:
  * logs `bleu`, `chrf` and the tokens seen so far to TensorBoard (`<run>/tensorboard/bleu`)
    and to the step-time report (`report.json` → `evaluations`);
  * keeps the best model by BLEU in `<run>/best/` (weights only) with `best.json`;
  * with `patience`, stops training after that many evaluations without a new best.

Tokens seen (non-pad source and target tokens of every training step so far) come from the
step-time report, so an underfit run shows itself: a low BLEU after few tokens is a short
run, not a bad recipe. The time spent here is not training time (`budget.TrainingClock`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from transformer.base import atomic
from transformer.inference.evaluation import score
from transformer.inference.rundir import BEST_DIR, BEST_FILE, TENSORBOARD_DIR
from transformer.measure.reports import StepTimeReport

log = logging.getLogger(__name__)


def fixed_sample(sources: Sequence[str], references: Sequence[str], size: int) -> tuple[list, list]:
    """`size` pairs spread evenly over the split (deterministic: the same every evaluation)."""
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources for {len(references)} references")
    if size >= len(sources):
        return list(sources), list(references)
    picks = np.linspace(0, len(sources) - 1, size).round().astype(int)
    return [sources[i] for i in picks], [references[i] for i in picks]


class ValidationBleu(keras.callbacks.Callback):
    """Periodic validation BLEU with best-checkpoint keeping and optional early stopping.

    Args:
        translator_fn: callable(model) → object with `translate(list[str]) → list[str]`.
        sources, references: the fixed validation sample (str lists of equal length).
        run_dir: Path. `best/` and `best.json` go here; None keeps nothing on disk.
        every_steps: int or None. Evaluate every N optimizer steps; None: at epoch ends.
        patience: int or None. Evaluations without a new best before stopping.
        report: StepTimeReport or None. Gets an `evaluations` entry per evaluation.
        clock: TrainingClock or None. Its training seconds are logged with each evaluation, and
            it is told how long an evaluation takes (the wall clock's reserve).
        fractions: increasing floats in (0, 1) or None. Evaluate when `clock.progress` reaches
            each, and at the end of training, instead of at every epoch end.
        loss_batches: tf.data.Dataset of `((src, tgt_in), tgt_out)` batches or None: the
            validation loss / masked accuracy sample.
    """

    def __init__(self, translator_fn: Callable, sources: Sequence[str], references: Sequence[str], *,
                 run_dir: Optional[Path] = None, every_steps: Optional[int] = None,
                 patience: Optional[int] = None, report: Optional[StepTimeReport] = None, clock=None,
                 fractions: Optional[Sequence[float]] = None, loss_batches=None):
        super().__init__()
        if not sources:
            raise ValueError("ValidationBleu needs at least one validation sentence")
        self.translator_fn = translator_fn
        self.sources, self.references = list(sources), list(references)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.every_steps = every_steps
        self.patience = patience
        self.report = report if report is not None else StepTimeReport()
        self.clock = clock
        self.fractions = list(fractions) if fractions is not None and clock is not None else None
        self.loss_batches = loss_batches
        self.seconds_spent = 0.0  # all evaluations of this run so far
        self.best: Optional[dict] = None
        self.evaluations_since_best = 0
        self.early_stopped = False
        self._translator = None
        self._best_manager = None
        self._writer = None
        self._last_step = -1
        self._next_fraction = 0
        self._loss_step = None
        self._started = time.perf_counter()

    # ---------------------------------------------------------------- Keras hooks
    def on_train_begin(self, logs=None):
        self._started = time.perf_counter()
        if self.best is None and self.run_dir is not None and (self.run_dir / BEST_FILE).exists():
            self.best = json.loads((self.run_dir / BEST_FILE).read_text())  # a resumed run keeps its best
        if self.fractions is not None:  # a resumed run skips the points it has passed
            progress = float(self.clock.progress.numpy())
            self._next_fraction = sum(1 for f in self.fractions if f <= progress)

    def on_train_batch_end(self, batch, logs=None):
        if self.every_steps and self._step() % self.every_steps == 0:
            self.evaluate()
        elif self.fractions is not None and self._next_fraction < len(self.fractions):
            progress = self.clock.fraction_done()
            if progress >= self.fractions[self._next_fraction] and not self.model.stop_training:
                self._next_fraction = sum(1 for f in self.fractions if f <= progress)
                self.evaluate()

    def on_epoch_end(self, epoch, logs=None):
        if self.fractions is None and (not self.every_steps or self.model.stop_training):
            self.evaluate(epoch=epoch + 1)

    def on_train_end(self, logs=None):
        if self.fractions is not None:
            self.evaluate()  # the end of training (a no-op if this step was just evaluated)
        if self._writer is not None:
            self._writer.flush()

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, epoch: Optional[int] = None) -> Optional[dict]:
        """Scores the sample now (once per optimizer step); returns the evaluation record."""
        step = self._step()
        if step == self._last_step:
            return None
        self._last_step = step
        start = time.perf_counter()
        if self._translator is None:
            self._translator = self.translator_fn(self.model)
        hypotheses = self._translator.translate(self.sources)
        scores = score(hypotheses, self.references)
        loss = self._validation_loss()
        tokens = self.report.tokens_seen()
        record = {
            "step": step,
            "epoch": epoch,
            "bleu": scores["bleu"],
            "bleu_lowercase": scores["bleu_lowercase"],
            "chrf": scores["chrf"],
            "val_loss": loss[0] if loss else None,
            "val_masked_accuracy": loss[1] if loss else None,
            "sentences": len(self.sources),
            "src_tokens_seen": tokens["src_tokens"],
            "tgt_tokens_seen": tokens["tgt_tokens"],
            "train_time_s": round(self.clock.seconds, 1) if self.clock is not None else None,
            "wall_time_s": round(time.perf_counter() - self._started, 1),
            "eval_s": None,
            "example": hypotheses[0],
        }
        improved = self.best is None or record["bleu"] > self.best["bleu"]
        if improved:
            self.best = dict(record)
            self.evaluations_since_best = 0
            self._save_best(record)
        else:
            self.evaluations_since_best += 1
        seconds = time.perf_counter() - start
        self.seconds_spent += seconds
        if self.clock is not None:
            self.clock.expect_at_end("evaluation", seconds)
        record["eval_s"] = round(seconds, 1)
        record["best"] = improved
        self._log(record)
        if self.patience and self.evaluations_since_best >= self.patience:
            log.info("early stopping: no BLEU improvement in %d evaluations (best %.2f at step %d)",
                     self.patience, self.best["bleu"], self.best["step"])
            self.early_stopped = True
            self.model.stop_training = True
        return record

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _validation_loss(self) -> Optional[tuple[float, float]]:
        """(masked loss, masked accuracy) over `loss_batches`, weighted by target tokens; None without."""
        if self.loss_batches is None:
            return None
        if self._loss_step is None:
            model, loss_fn = self.model, self.model.loss
            inputs_spec, target_spec = self.loss_batches.element_spec

            # One trace for every batch shape (the dataset's spec has unknown dimensions; traced
            # per shape, the sample's batches gave two), without AutoGraph (no Python control flow here).
            @tf.function(input_signature=[inputs_spec, target_spec], autograph=False)
            def step(inputs, target):
                logits = model(inputs, training=False)
                mask = tf.cast(tf.not_equal(target, 0), tf.float32)
                correct = tf.cast(tf.equal(tf.cast(tf.argmax(logits, -1), target.dtype), target), tf.float32)
                tokens = tf.reduce_sum(mask)
                return loss_fn(target, logits) * tokens, tf.reduce_sum(correct * mask), tokens

            self._loss_step = step
        loss_sum = correct = tokens = 0.0
        for inputs, target in self.loss_batches:
            batch_loss, batch_correct, batch_tokens = (float(v) for v in self._loss_step(inputs, target))
            loss_sum, correct, tokens = loss_sum + batch_loss, correct + batch_correct, tokens + batch_tokens
        return round(loss_sum / max(tokens, 1.0), 4), round(correct / max(tokens, 1.0), 4)

    def _save_best(self, record: dict) -> None:
        if self.run_dir is None:
            return
        if self._best_manager is None:
            checkpoint = tf.train.Checkpoint(model=self.model)
            self._best_manager = tf.train.CheckpointManager(checkpoint, str(self.run_dir / BEST_DIR), max_to_keep=1)
        path = self._best_manager.save(checkpoint_number=record["step"])
        atomic.write_json(self.run_dir / BEST_FILE, {**record, "checkpoint": path})

    def _log(self, record: dict) -> None:
        loss = f", loss {record['val_loss']:.3f}" if record.get("val_loss") is not None else ""
        log.info("step %d: validation BLEU %.2f chrF %.2f%s on %d sentences (best %.2f) after %s target tokens; "
                 "eval %.1f s", record["step"], record["bleu"], record["chrf"], loss, record["sentences"],
                 self.best["bleu"], f"{record['tgt_tokens_seen']:,}" if record["tgt_tokens_seen"] else "?",
                 record["eval_s"])
        self.report.evaluations.append(record)
        self.report.write()
        if self.run_dir is not None:
            if self._writer is None:
                self._writer = tf.summary.create_file_writer(str(self.run_dir / TENSORBOARD_DIR / "bleu"))
            with self._writer.as_default(step=record["step"]):
                tf.summary.scalar("validation_bleu", record["bleu"])
                tf.summary.scalar("validation_chrf", record["chrf"])
                if record.get("val_loss") is not None:
                    tf.summary.scalar("validation_loss", record["val_loss"])
                if record["tgt_tokens_seen"] is not None:
                    tf.summary.scalar("target_tokens_seen", record["tgt_tokens_seen"])
