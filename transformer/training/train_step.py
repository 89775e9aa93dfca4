"""One training step on a batch, as `fit` runs it: the compiled step traced for unknown dims.

`fit` feeds Keras' compiled step (`one_step_on_data`) from a `tf.data` iterator whose
`element_spec` has unknown dims, so one trace serves every batch shape (`BatchTimer` and
`XlaWarmup` trace it that way too). `train_on_batch` instead traces it for the first batch's
concrete shape, and Keras' einsum then takes another kernel path: on an EPYC Zen 4
(`avx512_bf16`) the tutorial model's bfloat16 step ran 1.13-1.28× slower that way, the default
model 1.02× (docs/speed.md). Benchmarks and the step probes of `--num-layers auto` and
`--max-tokens auto` (`batch_probe.step_timer`) time this step instead:

    step = train_step(model)     # compiled model: builds its optimizer, traces once
    loss = step(inputs, labels)  # ((src, tgt_in), tgt_out) int32 [rows, length]; waits for it
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from transformer.training.timing import compiled_step, sync_logs

BATCH_SPEC = ((tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)),
              tf.TensorSpec([None, None], tf.int32))  # ((src, tgt_in), tgt_out), as the pipeline's batches


def train_step(model: Any) -> Callable[[Any, Any], float]:
    """`step(inputs, labels)` → the batch's loss (float; the step has finished) for a compiled model.

    inputs: `(src, tgt_in)`, labels: `tgt_out`, int32 `[rows, length]` arrays or tensors of any
    shape: every call runs the one trace for unknown dims (under `jit_compile`, one XLA program
    per new shape, as in training). The optimizer's variables are built first, as `fit` does.
    Falls back to `train_on_batch` where Keras' private step cannot be found.
    """
    model.optimizer.build(model.trainable_variables)
    model.make_train_function()
    step = compiled_step(model.train_function)
    if step is None:  # another Keras layout: static shapes, but still a real step
        return lambda inputs, labels: float(model.train_on_batch(inputs, labels, return_dict=True)["loss"])
    step.get_concrete_function(BATCH_SPEC)

    def run(inputs: Any, labels: Any) -> float:
        (src, tgt_in), tgt_out = inputs, labels
        batch = ((tf.convert_to_tensor(src, tf.int32), tf.convert_to_tensor(tgt_in, tf.int32)),
                 tf.convert_to_tensor(tgt_out, tf.int32))
        return sync_logs(step(batch))

    run.compiled = step  # the traced `tf.function` (tests count its traces)
    return run
