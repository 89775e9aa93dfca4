"""Step-level continuous batching: sentences join a running greedy decode between steps, and leave it when done.

    decoder = ContinuousDecoder(translator)            # a greedy Translator (run directory or rebuilt export)
    decoder.add(["olá mundo", "bom dia"], ["a", "b"])  # encoded now, decoded from the next step on
    while decoder.active:
        for key, translation in decoder.step():      # one token for every active row
            ...

Offline, a chunk of sentences is decoded until its longest ends; a server's sentences arrive
at any time, so a batch decoded that way holds short sentences that wait for long ones and
new sentences that wait for the whole batch. Here the batch is re-formed at every step:
  - `add` tokenizes and encodes new sentences (their cross-attention keys/values, source
    bias and output bound, as `Translator` computes them) and appends them as rows whose
    next input is [START];
  - `step` decodes `steps_per_call` tokens for every row with the lean one-token step
    (`transformer.model.step_decoder.StepDecoder`), in one graph call whose `tf.while_loop`
    runs the steps (it stops early once every row has ended), and marks the rows that emitted
    [END] or reached their output bound as ended; their translations come back together every
    `RETURN_EVERY` steps, and ended rows leave the batch at the next `add` or once they are
    half of it (a gather of every cache costs about a third of a step). A row that ends
    inside a call is decoded to the call's end, its extra tokens dropped: a call costs a
    step's graph once, about 3 ms on a 2-core EPYC Zen 3 (one step per call: 8.8 / 13.3 ms
    per step at 8 / 32 rows; four: 5.5 / 10.3 ms, steps in a loop; 2026-11-26).
The rows share one self-attention cache `[rows, heads, columns, key_dim]` grown by one column
per step; a row that joined at column `start` sits at position `column - start` and masks
the columns before `start` (`StepDecoder.step`'s `self_bias`, -1e9: their softmax weight is
exactly 0). Columns no row uses any more are cut off when rows leave. The source axis of the
cross-attention keys/values is padded to the longest active source, with the padding masked as
offline. So every row decodes what the offline greedy translator decodes for it alone: a row's tokens
never depend on the other rows (the tests compare them).

Greedy only (a beam's hypotheses trade cache entries by parent, which rows joining and
leaving between steps do not track) and without XLA (shapes change every step).
"""

from __future__ import annotations

import collections
import itertools
from typing import Hashable, Sequence

import numpy as np
import tensorflow as tf

from transformer.base.config import DecodeConfig, ModelConfig
from transformer.base.constants import END_ID, PAD_ID, START_ID
from transformer.inference import casing, segmenting
from transformer.inference.decoding import DEFAULT_FORBIDDEN_IDS, ROW_CONTEXT
from transformer.inference.rundir import build_model, cast_model
from transformer.inference.translator import SENTENCES_SPEC, Translator, as_string_batch
from transformer.model.layers import NEG_INF
from transformer.model.step_decoder import StepDecoder

# Ended rows' translations are returned every this many steps (one detokenizer call for all of
# them; a call costs about a quarter of a step), or as soon as no row is left decoding.
RETURN_EVERY = 4
# Tokens per row per `step` call: sentences join and leave between calls, so a row that ends
# waits up to this many steps minus one, decoded for nothing, and a new one as many to start.
STEPS_PER_CALL = 4


class ContinuousDecoder:
    """Greedy decoding of a batch that sentences join and leave between steps (see the module).

    Args:
        translator: a `Translator` with `beam_size` 1 and no XLA; its model, tokenizers and
            output bounds are used.
        steps_per_call: int >= 1. Tokens `step` decodes per row, at most (see the module).

    Attributes:
        active: int, rows decoding plus ended rows whose translations are not returned yet.
        steps, row_steps: int, steps decoded and rows over all of them.
    """

    def __init__(self, translator: Translator, steps_per_call: int = STEPS_PER_CALL):
        if steps_per_call < 1:
            raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}")
        self.steps_per_call = steps_per_call
        config = translator.config
        if config.beam_size != 1 or config.jit_compile:
            raise ValueError(f"continuous batching decodes greedily without XLA; got beam_size {config.beam_size}, "
                             f"jit_compile {config.jit_compile}")
        self.translator = translator
        model = translator.model
        self._decoder = StepDecoder(model, config.projection_dtype, DEFAULT_FORBIDDEN_IDS)  # never generated
        d_model, heads, key_dim = model.config.d_model, model.config.num_heads, model.config.key_dim
        self._dtype = self._decoder.dtype
        # Weights in the step's layout, once (StepDecoder.start on an empty batch computes them).
        context, _ = self._decoder.start(tf.zeros([0, 1, d_model], self._dtype), tf.zeros([0, 1], tf.bool))
        self._shared = {key: value for key, value in context.items() if key not in ROW_CONTEXT}  # every row's
        kv = tf.TensorSpec([None, heads, None, key_dim], self._dtype)
        layers = [(kv, kv)] * len(model.decoder_layers)
        row = tf.TensorSpec([None], tf.int32)
        state = (row, row, row, layers, layers, tf.TensorSpec([None, 1, 1, None], tf.float32))
        self._admit = tf.function(self._admit_impl, input_signature=[SENTENCES_SPEC, row, state], autograph=False)
        self._keep = tf.function(self._keep_impl, input_signature=[row, state], autograph=False)
        self._advance = tf.function(self._advance_impl, input_signature=[state, tf.TensorSpec([], tf.int32)],
                                    autograph=False)
        self._state_invariants = tf.nest.map_structure(lambda spec: spec.shape, state)
        self._detokenize_ids = tf.function(translator.detokenize, input_signature=[tf.TensorSpec([None, None], tf.int32)],
                                            autograph=False)
        self._pieces = tf.function(translator.pieces, input_signature=[SENTENCES_SPEC], autograph=False)
        self._shouted = tf.function(segmenting.shouted_lines, input_signature=[SENTENCES_SPEC], autograph=False)
        self.steps = self.row_steps = 0
        self._returned_at = 0  # `steps` when ended rows were last returned
        self.reset()

    def reset(self) -> None:
        """Drops every row (after a failure)."""
        self._keys: list = []  # per row: (sentence number, piece number)
        # sentence number → (the caller's key, piece translations (None until ended), written in capitals)
        self._sentences: dict = {}
        self._added = 0  # sentences added so far (their numbers)
        self._tokens: list[list[int]] = []  # per row: generated ids so far
        self._has_tokens: list[bool] = []  # per row: the source has a token besides [START]/[END]
        self._alive: list[bool] = []  # per row: not yet ended (an ended row stays until the next compaction)
        self._ended: list[tuple] = []  # (key, tokens, has_tokens) of rows ended and not yet returned
        rows = tf.zeros([0], tf.int32)
        empty = tf.zeros([0, self._decoder.heads, 0, self._decoder.key_dim], self._dtype)
        layers = [(empty, empty) for _ in self._shared["weights"]]
        # (ids [rows] next inputs, start [rows] first column, left [rows] tokens still allowed,
        #  self cache, cross keys/values (per layer [rows, heads, columns or S, key_dim]), bias [rows, 1, 1, S])
        self._state = (rows, rows, rows, layers, layers, tf.zeros([0, 1, 1, 0], tf.float32))

    @property
    def active(self) -> int:
        """Rows decoding, plus rows ended whose translations `step` has not returned yet."""
        return sum(self._alive) + len(self._ended)

    # ---- joining and stepping ------------------------------------------------------------
    def add(self, sentences: Sequence, keys: Sequence[Hashable]) -> None:
        """Encodes `sentences` (str or bytes) and appends them as rows; `keys` come back from `step`.
        A sentence over the model's length is cut into pieces as offline (`Translator.pieces`), a
        row each, its translation returned once all have ended. Rows that ended leave the batch
        in the same call."""
        if len(sentences) != len(keys):
            raise ValueError(f"{len(sentences)} sentences but {len(keys)} keys")
        if not sentences:
            return
        batch = as_string_batch(list(sentences))
        pieces, rows = self._pieces(batch)
        rows = (rows.numpy() + self._added).tolist()
        counts = collections.Counter(rows)  # pieces per sentence number (rows come sorted)
        for number, key, shouted in zip(itertools.count(self._added), keys, self._shouted(batch).numpy().tolist()):
            self._sentences[number] = (key, [None] * counts[number], shouted)
        self._added += len(sentences)
        self._state, has_tokens = self._admit(pieces, self._kept(), self._state)
        self._keys += [(row, piece) for row, group in itertools.groupby(rows) for piece, _ in enumerate(group)]
        self._tokens += [[] for _ in rows]
        self._has_tokens += has_tokens.numpy().tolist()
        self._alive += [True] * len(rows)

    def step(self) -> list[tuple[Hashable, str]]:
        """Decodes `steps_per_call` tokens for every row (fewer once all have ended). Returns (key,
        translation) of the rows that ended, every `RETURN_EVERY` steps (one detokenizer call for
        them all) or once no row is left decoding."""
        if any(self._alive):
            ids, done, self._state = self._advance(self._state, tf.constant(self.steps_per_call, tf.int32))
            ids, done = ids.numpy().tolist(), done.numpy().tolist()  # [rows, steps taken]
            taken = len(ids[0])
            self.steps += taken
            self.row_steps += len(self._keys) * taken
            for row, (tokens, ended) in enumerate(zip(ids, done)):
                if not self._alive[row]:
                    continue
                for token, last in zip(tokens, ended):
                    self._tokens[row].append(token)
                    if last:  # later tokens of this call are dropped
                        self._alive[row] = False
                        self._ended.append((self._keys[row], self._tokens[row], self._has_tokens[row]))
                        break
            if 2 * sum(self._alive) < len(self._alive):  # over half the rows ended: drop them
                self._state = self._keep(self._kept(), self._state)
        if not self._ended or (any(self._alive) and self.steps - self._returned_at < RETURN_EVERY):
            return []
        self._returned_at = self.steps
        texts = self._detokenize([tokens for _, tokens, _ in self._ended])
        finished, shouted = [], []
        for ((number, piece), _, has_tokens), text in zip(self._ended, texts):
            key, translations, capitals = self._sentences[number]
            translations[piece] = text if has_tokens else ""
            if None not in translations:  # its last piece
                finished.append((key, segmenting.join_texts(translations)))
                shouted.append(capitals)
                del self._sentences[number]
        self._ended = []
        if any(shouted):  # as the Translator restores them (casing)
            restored = casing.restore(tf.constant([text for _, text in finished], tf.string), tf.constant(shouted))
            finished = [(key, text.decode("utf-8", "replace")) for (key, _), text in zip(finished, restored.numpy())]
        return finished

    def _kept(self) -> tf.Tensor:
        """The rows still decoding, `[kept]` int32; the Python side forgets the others."""
        kept = [row for row, alive in enumerate(self._alive) if alive]
        for name in ("_keys", "_tokens", "_has_tokens", "_alive"):
            setattr(self, name, [getattr(self, name)[row] for row in kept])
        return tf.constant(kept, tf.int32)

    def translate(self, sentences: Sequence) -> list[str]:
        """Decodes `sentences` alone, to the end (warm-up, tests)."""
        self.add(sentences, range(len(sentences)))
        out = {}
        while self.active:
            out.update(self.step())
        return [out[i] for i in range(len(sentences))]

    def _detokenize(self, rows: list[list[int]]) -> list[str]:
        width = max(len(tokens) for tokens in rows)
        ids = np.full([len(rows), width], PAD_ID, np.int32)
        for i, tokens in enumerate(rows):
            ids[i, :len(tokens)] = tokens
        return [t.decode("utf-8", "replace") for t in self._detokenize_ids(tf.constant(ids)).numpy()]

    # ---- graph functions -------------------------------------------------------------------
    def _admit_impl(self, sentences, kept, state):
        """Keeps rows `kept` of `state`, encodes `[n]` strings and appends them as rows whose next input is [START]
        (a zero self-attention cache, masked by their `start`; cross keys/values and bias padded to
        the longer source axis). Returns (state, has_tokens `[n]` bool)."""
        ids, start, left, cache, cross, bias = self._keep_impl(kept, state)
        src, has_tokens = self.translator.source_ids(sentences)
        src_ids = tf.cast(src.to_tensor(), tf.int32)  # [n, S]
        memory, src_mask = self.translator.model.encode(src_ids, training=False)
        context, _ = self._decoder.start(memory, src_mask)
        n, columns = tf.shape(src_ids)[0], tf.shape(cache[0][0])[2]
        ids = tf.concat([ids, tf.fill([n], START_ID)], 0)
        start = tf.concat([start, tf.fill([n], columns)], 0)
        left = tf.concat([left, self.translator._row_limits(src_ids)], 0)
        cache, cross, bias = self._join(cache, cross, bias, context["cross"], context["bias"])
        return (ids, start, left, cache, cross, bias), has_tokens

    def _advance_impl(self, state, steps):
        """Up to `steps` tokens per row in one `tf.while_loop`, stopping once every row has ended.
        Returns (ids `[rows, taken]`, ended `[rows, taken]` bool (see `_step`), state)."""
        rows = tf.shape(state[0])[0]

        def body(t, state, ids, ended):
            next_ids, done, state = self._step(state)
            return t + 1, state, ids.write(t, next_ids), ended.write(t, done)

        def cond(t, state, ids, ended):
            return (t < steps) & tf.reduce_any(state[2] > 0)

        arrays = [tf.TensorArray(dtype, size=0, dynamic_size=True, element_shape=[None]) for dtype in (tf.int32, tf.bool)]
        _, state, ids, ended = tf.while_loop(
            cond, body, (tf.constant(0), state, *arrays),
            shape_invariants=(tf.TensorShape([]), self._state_invariants, tf.TensorShape(None), tf.TensorShape(None)))
        return (tf.reshape(tf.transpose(ids.stack()), [rows, -1]), tf.reshape(tf.transpose(ended.stack()), [rows, -1]),
                state)

    def _step(self, state):
        """One token per row (row r at position `columns - start[r]`). Returns (next ids `[rows]`,
        ended `[rows]` bool: [END] or the last allowed token (rows ended before stay ended), state)."""
        ids, start, left, cache, cross, bias = state
        columns = tf.shape(cache[0][0])[2]
        visible = tf.range(columns + 1)[tf.newaxis] >= start[:, tf.newaxis]  # [rows, columns + 1]
        self_bias = tf.where(visible, 0.0, NEG_INF)[:, tf.newaxis, tf.newaxis, :]  # [rows, 1, 1, columns + 1]
        context = {**self._shared, "cross": cross, "bias": bias}
        positions = tf.where(left > 0, columns - start, 0)  # an ended row, still in the batch, may be past max_length
        logits, cache, _ = self._decoder.step(context, ids, positions, cache, self_bias=self_bias)
        next_ids = tf.argmax(logits, axis=-1, output_type=tf.int32)  # forbidden ids: NEG_INF in the projection's bias
        left = tf.where(tf.equal(next_ids, END_ID), 0, left - 1)
        return next_ids, left <= 0, (next_ids, start, left, cache, cross, bias)

    def _join(self, cache, cross, bias, new_cross, new_bias):
        """Appends new rows: a zero self-attention cache (masked by their `start`), cross
        keys/values and bias padded to the longer source axis of the two."""
        n, columns = tf.shape(new_bias)[0], tf.shape(cache[0][0])[2]
        length = tf.maximum(tf.shape(bias)[3], tf.shape(new_bias)[3])

        def pad(x, axis, value=0.0):  # source axis → `length`
            paddings = [[0, 0]] * 4
            paddings[axis] = [0, length - tf.shape(x)[axis]]
            return tf.pad(x, paddings, constant_values=value)

        zeros = tf.zeros([n, self._decoder.heads, columns, self._decoder.key_dim], self._dtype)
        cache = [(tf.concat([k, zeros], 0), tf.concat([v, zeros], 0)) for k, v in cache]
        cross = [(tf.concat([pad(k, 2), pad(nk, 2)], 0), tf.concat([pad(v, 2), pad(nv, 2)], 0))
                 for (k, v), (nk, nv) in zip(cross, new_cross)]
        return cache, cross, tf.concat([pad(bias, 3, NEG_INF), pad(new_bias, 3, NEG_INF)], 0)

    @staticmethod
    def _keep_impl(keep, state):
        """Rows `keep` of `state`; cuts the cache columns before the earliest kept `start` and the
        source positions after the longest kept source (sources are padded at the end)."""
        ids, start, left, cache, cross, bias = state
        start, bias = tf.gather(start, keep), tf.gather(bias, keep)
        first = tf.reduce_min(start)
        length = tf.reduce_max(tf.reduce_sum(tf.cast(tf.equal(bias, 0.0), tf.int32), -1))
        cache = [(tf.gather(k, keep)[:, :, first:], tf.gather(v, keep)[:, :, first:]) for k, v in cache]
        cross = [(tf.gather(k, keep)[:, :, :length], tf.gather(v, keep)[:, :, :length]) for k, v in cross]
        return tf.gather(ids, keep), start - first, tf.gather(left, keep), cache, cross, bias[..., :length]


def translator_from_saved(module, manifest: dict) -> Translator:
    """A `Translator` over a loaded export's tokenizers and weights (what `ContinuousDecoder` needs).

    Args:
        module: the export loaded with `tf.saved_model.load` (its `tokenizers`, and its
            serving signature's variables, named by their path in the model).
        manifest: the export's translator.json (`model` and `decode` configs).

    The model is rebuilt from `manifest["model"]` in the exported weights' dtype (float32, or
    bfloat16 for a cast export) and every weight is assigned from the variable of the same path (below the model's name).
    """
    def inside(path: str) -> str:  # a weight's path below the model's own (auto-numbered) name
        return path.split(":")[0].split("/", 1)[-1]

    variables = {inside(v.name): v for v in module.signatures["serving_default"].variables}
    model = build_model(ModelConfig(**manifest["model"]))
    if any(v.dtype == tf.bfloat16 for v in variables.values()):
        model = cast_model(model, "bfloat16")
    missing = [w.path for w in model.weights if inside(w.path) not in variables]
    if missing:
        raise ValueError(f"the export has no variable for {len(missing)} model weights, e.g. {missing[:3]}")
    for weight in model.weights:
        weight.assign(variables[inside(weight.path)])
    return Translator(module.tokenizers, model, DecodeConfig(**manifest["decode"]))
