"""Export a Translator as a self-contained SavedModel, and load one back.

Signatures of an exported model (inputs and outputs are named):

    serving_default:  {"sentences": tf.string [batch]} → {"translations": tf.string [batch]}
    attention:        {"sentences": tf.string [batch]} → {"line_translations" [batch], and per
                      piece of a sentence (long ones cut as translated): "rows", "translations",
                      "source_tokens", "source_lengths", "target_ids", "target_tokens",
                      "target_lengths", "attention" [pieces, heads, steps, src_len]}
                      (see Translator.serve_attention)

The tokenizers travel inside (their vocabularies are SavedModel assets), so loading needs
only `import tensorflow, tensorflow_text` — tensorflow_text registers the tokenizer ops:

    import tensorflow as tf, tensorflow_text  # noqa: F401
    tf.config.threading.set_intra_op_parallelism_threads(1)  # optional, before loading: see below
    translate = tf.saved_model.load(path).signatures["serving_default"]
    translate(sentences=tf.constant(["olá mundo"]))["translations"]

An export decodes its chunks in `DecodeConfig.streams` loops at once; the loading process's
thread pools decide how fast (`runtime.threads.decoding_threads`: on 2 cores one intra-op
thread and one inter-op thread per loop, 1.46× TensorFlow's defaults); `configure_decoding_threads`
sets them for the commands, before anything is loaded.

The directory also holds `translator.json` (decode config, model config, versions). The
SavedModel is written to a temporary sibling and renamed into place, so a failed export
never leaves a half-written model behind.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer ops for loading)

from transformer.base import atomic
from transformer.base.constants import EXPORT_MANIFEST
from transformer.base.errors import ConfigError, MissingFileError, OutputExistsError
from transformer.inference.ctranslate2_export import CTranslate2Translator, is_ctranslate2_dir
from transformer.inference.rundir import is_run_dir, translator_from_run
from transformer.inference.translator import ATTENTION_OUTPUTS, DecodeConfig, as_string_batch
from transformer.runtime.artifacts import EXPORT_HINT, load_saved_model
from transformer.runtime.threads import Threads, configure_threads, decoding_threads, usable_cores

SERVING_SIGNATURE = "serving_default"
ATTENTION_SIGNATURE = "attention"
INPUT_KEY = "sentences"
OUTPUT_KEY = "translations"
MANIFEST = EXPORT_MANIFEST


def export_translator(translator, path: str | Path, *, overwrite: bool = False, extra: Optional[dict] = None) -> Path:
    """Writes `translator` (a `transformer.inference.translator.Translator`) as a SavedModel at `path`.

    Args:
        translator: the Translator; its DecodeConfig (beam size, XLA, …) is baked in.
        path: output directory.
        overwrite: bool. Replace an existing directory. Defaults to False (error).
        extra: optional dict added to translator.json (e.g. the run directory).

    Returns:
        The export directory.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path} already exists; pass overwrite=True (--overwrite) to replace it",
                                hint="scripts/export.py --overwrite replaces it, or choose another --output")
    with atomic.staged_directory(path) as staging:
        # The tf.functions themselves, not concrete functions traced here: `save` traces every
        # function again in its own context (part of TensorFlow's cache key), so a trace made
        # before it would be thrown away (~40% of an export's time).
        signatures = {SERVING_SIGNATURE: translator.serve, ATTENTION_SIGNATURE: translator.serve_attention}
        # Track the raw tf.Variables the signatures capture (Keras 3 wraps them), as Keras'
        # ExportArchive does: without this, TF1-style loaders (`saved_model_cli run`, TF
        # Serving) fail with "Could not find variable …" (keras-team/keras#20095). The other
        # variables they capture (the tokenizers' vocabularies) are tf.Variables already.
        translator._exported_variables = _raw_variables(translator.model)
        tf.saved_model.save(translator, str(staging), signatures=signatures)
        manifest = {
            "signatures": {
                SERVING_SIGNATURE: {"inputs": {INPUT_KEY: "tf.string [batch]"},
                                    "outputs": {OUTPUT_KEY: "tf.string [batch]"}},
                ATTENTION_SIGNATURE: {"inputs": {INPUT_KEY: "tf.string [batch]"},
                                      "outputs": sorted(ATTENTION_OUTPUTS)},
            },
            "decode": translator.config.to_dict(),
            "model": {k: getattr(translator.model.config, k) for k in translator.model.config.__dataclass_fields__},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "tensorflow": tf.__version__,
            "tensorflow_text": tensorflow_text.__version__,
            **(extra or {}),
        }
        atomic.write_json(staging / MANIFEST, manifest)
    return path


def _raw_variables(model) -> list:
    """The tf.Variables behind a Keras 3 model's weights (`KerasVariable.value`, no autocast outside a scope)."""
    variables = [weight.value for weight in model.weights]
    if not all(isinstance(v, tf.Variable) for v in variables):
        raise TypeError(f"expected Keras variables backed by tf.Variable, got {sorted({type(v).__name__ for v in variables})}")
    return variables


class ExportedTranslator:
    """A loaded export with the Translator's Python conveniences.

    translate(list of str) → list of str;  attention(list of str) → dict of numpy arrays.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not (self.path / "saved_model.pb").is_file():
            raise MissingFileError(f"no SavedModel at {self.path} (expected {self.path / 'saved_model.pb'})",
                                   hint=EXPORT_HINT.format(path=self.path))
        self.module = load_saved_model(self.path, f"export {self.path}", EXPORT_HINT.format(path=self.path))
        self.serving = self.module.signatures[SERVING_SIGNATURE]
        self.attention_signature = self.module.signatures[ATTENTION_SIGNATURE]
        manifest = self.path / MANIFEST
        self.manifest = json.loads(manifest.read_text()) if manifest.is_file() else {}

    def __call__(self, sentences) -> tf.Tensor:
        return self.serving(**{INPUT_KEY: as_string_batch(sentences)})[OUTPUT_KEY]

    def translate(self, sentences) -> list[str]:
        return [t.decode("utf-8", "replace") for t in self(sentences).numpy()]

    def translate_with_lengths(self, sentences) -> tuple[list[str], np.ndarray]:
        """(translations, generated target tokens per sentence, [END] included)."""
        out = self.module.translate_lengths(as_string_batch(sentences))
        return [t.decode("utf-8", "replace") for t in out["translations"].numpy()], out["num_tokens"].numpy()

    def attention(self, sentences) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in self.attention_signature(**{INPUT_KEY: as_string_batch(sentences)}).items()}


def decode_config_of(path: str | Path, config: DecodeConfig = DecodeConfig()) -> DecodeConfig:
    """The DecodeConfig `open_translator(path, config)` decodes with, read without loading anything.

    An export (SavedModel or CTranslate2) decodes as exported (its translator.json; one loop when
    that predates streams); a run directory with `config`.
    """
    path = Path(path)
    if not (path / "saved_model.pb").is_file() and not is_ctranslate2_dir(path):
        return config
    manifest = path / MANIFEST
    decode = json.loads(manifest.read_text()).get("decode", {}) if manifest.is_file() else {}
    fields = {k: v for k, v in decode.items() if k in DecodeConfig.__dataclass_fields__}
    return DecodeConfig(**{"streams": 1, **fields})


def configure_decoding_threads(path: str | Path, config: DecodeConfig = DecodeConfig(), *,
                               intra_op: Optional[int] = None, inter_op: Optional[int] = None) -> Threads:
    """Sets TensorFlow's thread pools for decoding `path` (call it before loading anything).

    `runtime.threads.decoding_threads` for the streams `path` decodes with; `intra_op` /
    `inter_op` (flags, 0 = TensorFlow's default) replace its choice. Returns the pools in effect.
    """
    return configure_threads(decoding_threads(decode_config_of(path, config).streams, intra_op=intra_op,
                                              inter_op=inter_op))


def load_exported(path: str | Path) -> ExportedTranslator:
    """Loads an export written by `export_translator`."""
    return ExportedTranslator(path)


def open_translator(path, config: DecodeConfig = DecodeConfig(), checkpoint: str = "latest",
                    compute_type: Optional[str] = None):
    """A Translator (run directory), an ExportedTranslator (SavedModel) or a CTranslate2Translator
    (`export.py --format ctranslate2`) for `path`.

    All have `translate` and `translate_with_lengths`; the first two `attention` too. `config`
    applies to run directories only: an export decodes as it was exported. `compute_type`
    (CTranslate2 exports only; None: float32) is what CTranslate2 computes in, e.g. "int8";
    such a model decodes on one thread per batch, as many batches at once as there are cores
    (the fastest split on 2 cores, docs/speed.md).
    """
    path = Path(path)
    if is_ctranslate2_dir(path):
        return CTranslate2Translator(path, compute_type or "float32", intra_threads=1, inter_threads=usable_cores())
    if compute_type is not None:
        raise ConfigError(f"--compute-type {compute_type}: {path} is not a CTranslate2 export (model.bin + "
                          f"{MANIFEST}); it applies to those only",
                          hint="drop --compute-type, or write one: transformer-export --format ctranslate2")
    if (path / "saved_model.pb").is_file():
        return load_exported(path)
    if is_run_dir(path):
        return translator_from_run(path, config, checkpoint)
    raise MissingFileError(f"{path} is neither an exported SavedModel (saved_model.pb), a CTranslate2 export "
                           "(model.bin) nor a training run directory (config.json + checkpoints/)",
                           hint="--model takes a training run's --output directory or scripts/export.py's --output")
