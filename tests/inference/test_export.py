"""Export: a SavedModel with the tokenizers inside, loadable with only tensorflow + tensorflow_text."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf
from helpers_process import run_without_project
from helpers_translation import BAD_INPUTS, CAPITALS_INPUTS, tiny_translator

from transformer.inference.export import MANIFEST, decode_config_of, export_translator, load_exported
from transformer.inference.translator import DecodeConfig, Translator

SENTENCES = ["No princípio, Deus criou os céus e a terra.", "Deus é amor.", "", "Jesus chorou."] + BAD_INPUTS + CAPITALS_INPUTS

# Runs in a fresh interpreter: only tensorflow and tensorflow_text are imported, and the repo
# is not on sys.path, so nothing from `transformer` can be used by accident.
FRESH_PROCESS = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the tokenizer ops
assert not any(name == "transformer" or name.startswith("transformer.") for name in sys.modules)
model = tf.saved_model.load(sys.argv[1])
sentences = json.loads(sys.stdin.read())
sentences = [s.encode("latin-1") if isinstance(s, str) and s.startswith("\x00bytes:") else s for s in sentences]
inputs = tf.constant([s[7:] if isinstance(s, bytes) else s.encode() for s in sentences])
out = model.signatures["serving_default"](sentences=inputs)
print(json.dumps({"keys": sorted(out), "translations": [t.decode("utf-8") for t in out["translations"].numpy()]}))
"""


def _to_json(sentences):
    """Bytes (invalid UTF-8) travel as latin-1 text with a marker."""
    return json.dumps([("\x00bytes:" + s.decode("latin-1")) if isinstance(s, bytes) else s for s in sentences])


def _clean_env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture
def exported(tiny_export):
    """(translator, path) of the session's tiny export (conftest)."""
    return tiny_export


def test_fresh_process_with_only_tensorflow_loads_and_matches(exported):
    translator, path = exported
    expected = translator.translate(SENTENCES)
    out = run_without_project(FRESH_PROCESS, str(path), cwd=path.parent, stdin=_to_json(SENTENCES), timeout=600)
    assert out["keys"] == ["translations"]
    assert out["translations"] == expected
    assert len(out["translations"]) == len(SENTENCES)


def test_loader_matches_in_memory_translator(exported):
    translator, path = exported
    loaded = load_exported(path)
    translations = loaded.translate(SENTENCES)
    assert translations == translator.translate(SENTENCES)
    assert loaded.manifest["decode"]["streams"] == DecodeConfig().streams > 1  # the default: several loops at once
    assert translations == translator.with_config(streams=1).translate(SENTENCES)
    texts, lengths = loaded.translate_with_lengths(SENTENCES[:2])
    assert texts == translator.translate(SENTENCES[:2]) and len(lengths) == 2
    details = loaded.attention(SENTENCES[:2])
    assert details["attention"].ndim == 4 and details["translations"].shape == (2,)
    assert loaded.manifest["decode"]["beam_size"] == 1
    assert loaded.manifest["signatures"]["attention"]["outputs"] == sorted(loaded.attention_signature.structured_outputs)
    with pytest.raises(TypeError, match="expected a 1-D batch of strings"):
        loaded(tf.constant([1, 2]))


def test_export_refuses_to_overwrite(exported):
    translator, path = exported
    with pytest.raises(FileExistsError, match="overwrite"):
        export_translator(translator, path)


def test_an_export_traces_the_decoding_once(tmp_path, monkeypatch):
    """The chunk decoder is traced once for both loops and all three string functions: not again
    by `tf.saved_model.save` in its own context, and not saved as a function of its own. The
    functions are plain graph code: AutoGraph converts none of ours (its conversion was ~80% of
    an export's tracing time)."""
    from tensorflow.python.autograph.impl import api as autograph_api

    traces = []
    decode = Translator._decode_ids_impl
    monkeypatch.setattr(Translator, "_decode_ids_impl", lambda self, src_ids: traces.append(1) or decode(self, src_ids))
    # cut_over: the export cuts sources that fit the model as the in-memory translator does
    translator = tiny_translator(DecodeConfig(chunk_size=4, streams=2, cut_over=6), num_layers=1)
    converted, convert = [], autograph_api._convert_actual
    monkeypatch.setattr(autograph_api, "_convert_actual",
                        lambda entity, ctx: converted.append(getattr(entity, "__module__", None)) or convert(entity, ctx))
    loaded = load_exported(export_translator(translator, tmp_path / "export"))
    assert len(traces) == 1
    assert converted and not [module for module in converted if str(module).startswith("transformer")]
    assert not any("decode" in name for name in dir(loaded.module))
    sentences = SENTENCES[:3] + ["Deus é amor. Jesus chorou."]  # the last: 2 sentences, over 6 tokens
    assert len(translator.pieces(tf.constant(sentences))[1]) > 4 and loaded.manifest["decode"]["cut_over"] == 6
    assert loaded.translate(sentences) == translator.translate(sentences)


def test_the_loops_call_one_decode_function_that_is_optimised_once(exported):
    """Each decoding loop calls the chunk decoder as a function marked `_noinline`: TensorFlow
    optimises and instantiates its graph once at the first call, not once per loop as it would
    once inlined (the first call of a tiny 3-loop translator took 4-5 s inlined, 1.9 s not)."""
    from tensorflow.core.protobuf import saved_model_pb2

    translator, path = exported
    saved = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    library = saved.meta_graphs[0].graph_def.library.function
    decoders = [f for f in library if "_decode_ids_impl" in f.signature.name]
    assert len(decoders) == 1 and decoders[0].attr["_noinline"].b
    name = decoders[0].signature.name
    calls = [node for f in library for node in f.node_def
             if node.op in ("PartitionedCall", "StatefulPartitionedCall") and node.attr["f"].func.name == name]
    assert len(calls) == translator.config.streams > 1  # one call site per loop


def _saved_model_cli():
    cli = Path(sys.executable).with_name("saved_model_cli")
    return [str(cli)] if cli.exists() else [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli"]


# `saved_model_cli run` must execute the tensorflow_text ops, which the stock CLI never
# registers (it has no flag to load op libraries): this wrapper registers them first.
CLI_WITH_TF_TEXT = [sys.executable, "-c", "import sys, tensorflow_text; "
                    "from tensorflow.python.tools.saved_model_cli import main; "
                    "sys.argv[0] = 'saved_model_cli'; sys.exit(main())"]


def test_saved_model_cli_show_and_run(exported):
    _, path = exported
    show = subprocess.run(_saved_model_cli() + ["show", "--dir", str(path), "--all"], capture_output=True,
                          text=True, timeout=300, env=_clean_env())
    assert show.returncode == 0, show.stderr[-3000:]
    assert "signature_def['serving_default']" in show.stdout
    assert "inputs['sentences']" in show.stdout and "outputs['translations']" in show.stdout
    assert "dtype: DT_STRING" in show.stdout and "shape: (-1)" in show.stdout
    run = subprocess.run(
        CLI_WITH_TF_TEXT + ["run", "--dir", str(path), "--tag_set", "serve", "--signature_def", "serving_default",
                              "--input_exprs", "sentences=['Deus é amor.', '']"],
        capture_output=True, text=True, timeout=300, env=_clean_env())
    assert run.returncode == 0, run.stderr[-3000:]
    assert "translations" in run.stdout


def test_bfloat16_export_matches_in_memory_bfloat16_model(tmp_path):
    from transformer.inference.rundir import cast_model

    # one layer and one loop: an export traces each of both; test_loader_… checks several loops
    translator = tiny_translator(DecodeConfig(chunk_size=4, streams=1), num_layers=1)
    bf16 = Translator(translator.tokenizers, cast_model(translator.model, "bfloat16"), translator.config)
    assert bf16.model.encoder_layers[0].ffn.inner.kernel.dtype == "bfloat16"
    ids = tf.constant([[2, 5, 6, 3]])
    assert bf16.model((ids, ids)).dtype == tf.float32  # logits stay float32
    path = export_translator(bf16, tmp_path / "bf16")
    assert load_exported(path).translate(SENTENCES) == bf16.translate(SENTENCES)
    beam = bf16.with_config(beam_size=3, projection_dtype="bfloat16")  # beam search, bfloat16 logits
    loaded = load_exported(export_translator(beam, tmp_path / "bf16-beam"))
    assert loaded.manifest["decode"]["projection_dtype"] == "bfloat16"
    assert loaded.translate(SENTENCES) == beam.translate(SENTENCES)


def test_sentencepiece_export_is_deterministic_and_matches_in_a_fresh_process(tmp_path):
    """A translator over SentencePiece tokenizers: the export segments deterministically (the same
    output twice) and loads with tensorflow + tensorflow_text only, translating as in memory."""
    translator = tiny_translator(DecodeConfig(chunk_size=4, streams=1), algorithm="sentencepiece", num_layers=1)
    path = export_translator(translator, tmp_path / "translator")
    expected = translator.translate(SENTENCES)
    assert translator.translate(SENTENCES) == expected
    assert load_exported(path).translate(SENTENCES) == expected
    out = run_without_project(FRESH_PROCESS, str(path), cwd=path.parent, stdin=_to_json(SENTENCES), timeout=600)
    assert out["translations"] == expected


def test_decode_config_of_reads_an_export_without_loading_it(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"")  # never parsed: only translator.json is read
    (export / MANIFEST).write_text(json.dumps({"decode": {"beam_size": 4, "streams": 5, "unknown_field": 1}}))
    assert decode_config_of(export, DecodeConfig(streams=2)) == DecodeConfig(beam_size=4, streams=5)
    (export / MANIFEST).write_text(json.dumps({"decode": {"beam_size": 1}}))  # exported before streams existed
    assert decode_config_of(export).streams == 1
    run = tmp_path / "run"
    run.mkdir()
    assert decode_config_of(run, DecodeConfig(streams=2)).streams == 2  # a run directory decodes as told
