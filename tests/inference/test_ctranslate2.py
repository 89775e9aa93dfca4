"""CTranslate2 export: the converted weights give our model's probabilities and greedy outputs."""

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import script_main
from helpers_model import TINY_MODEL, build
from helpers_translation import BAD_INPUTS, CAPITALS_INPUTS, tiny_ctranslate2_export

from transformer.base.constants import END_ID, RESERVED_TOKENS, START_ID
from transformer.inference import decoding
from transformer.inference.translator import DecodeConfig

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is pinned in requirements.txt: pip install -r it")

from transformer.inference.ctranslate2_export import (  # noqa: E402
    SUPPRESSED,
    CTranslate2Translator,
    model_spec,
    output_bounds,
)

SENTENCES = ["No princípio, Deus criou os céus e a terra.", "Deus é amor.", "", "Jesus chorou.",
             "E disse Deus: Haja luz; e houve luz."] + BAD_INPUTS + CAPITALS_INPUTS

# Every architecture switch the conversion maps: head width (CTranslate2's head_dim), norm
# position (final norms), tied projection and tied source embedding.
VARIANTS = [
    dict(head_width="paper", layer_norm="post", tie_embeddings="none"),
    dict(head_width="tutorial", layer_norm="post", tie_embeddings="none"),
    dict(head_width="paper", layer_norm="pre", tie_embeddings="output"),
    dict(head_width="paper", layer_norm="pre", tie_embeddings="all", src_vocab_size=48),
]


def _vocab(size, prefix):
    return list(RESERVED_TOKENS) + [f"{prefix}{i}" for i in range(size - len(RESERVED_TOKENS))]


def _padded(rows):
    width = max(map(len, rows))
    return np.array([r + [0] * (width - len(r)) for r in rows], np.int32)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(str(x) for x in v.values()))
def test_converted_model_gives_our_log_probs_and_greedy_ids(variant, tmp_path):
    config = dataclasses.replace(TINY_MODEL, max_length=24, **variant)
    model = build(config, seed=3)
    src_vocab, tgt_vocab = _vocab(config.src_vocab_size, "s"), _vocab(config.tgt_vocab_size, "t")
    model_spec(model, src_vocab, tgt_vocab).save(str(tmp_path))
    converted = ctranslate2.Translator(str(tmp_path), device="cpu", compute_type="float32")
    rng = np.random.default_rng(1)
    sources = [[START_ID] + rng.integers(4, config.src_vocab_size, n).tolist() + [END_ID] for n in (5, 9, 1, 14)]
    targets = [rng.integers(4, config.tgt_vocab_size, n).tolist() for n in (4, 2, 1, 7)]
    source_tokens = [[src_vocab[i] for i in row] for row in sources]

    # Teacher-forced: CTranslate2 scores target + [END]; ours from the full decoder pass.
    scored = converted.score_batch(source_tokens, [[tgt_vocab[i] for i in row] for row in targets])
    tgt_in = _padded([[START_ID] + row for row in targets])
    log_probs = tf.nn.log_softmax(model((tf.constant(_padded(sources)), tf.constant(tgt_in)), training=False)).numpy()
    for b, (row, result) in enumerate(zip(targets, scored)):
        ours = [log_probs[b, t, token] for t, token in enumerate(row + [END_ID])]
        np.testing.assert_allclose(result.log_probs, ours, atol=1e-4)

    # Greedy, with our decoder's forbidden tokens: the same ids, [END] included.
    greedy = decoding.greedy_translate(model, tf.constant(_padded(sources)), 20)
    ours = [ids[:n].tolist() for ids, n in zip(greedy.ids.numpy(), greedy.lengths.numpy())]
    results = converted.translate_batch(source_tokens, beam_size=1, max_decoding_length=20, return_end_token=True,
                                        suppress_sequences=[["[PAD]"], ["[START]"]])
    assert [[tgt_vocab.index(t) for t in r.hypotheses[0]] for r in results] == ours


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny translator over the real test tokenizers (short output bound, so some rows hit
    it; sources over 8 tokens cut, as its manifest tells the wrapper) and its CTranslate2 export."""
    return tiny_ctranslate2_export(tmp_path_factory.mktemp("ct2"),
                                   DecodeConfig(chunk_size=4, max_output_ratio=0.5, max_output_extra=2, cut_over=8),
                                   seed=2)


@pytest.mark.parametrize("inter_threads", [1, 2])
def test_ctranslate2_translator_equals_ours_on_strings(exported, inter_threads):
    translator, path = exported
    ct2 = CTranslate2Translator(path, batch_size=3, inter_threads=inter_threads, intra_threads=1)
    texts, lengths = ct2.translate_with_lengths(SENTENCES)
    expected_texts, expected_lengths = translator.translate_with_lengths(SENTENCES)
    assert texts == expected_texts
    assert sum(bool(t) for t in texts) >= 5  # real outputs, not all empty
    assert lengths.tolist() == expected_lengths.tolist()
    assert lengths[SENTENCES.index("")] == 0 and texts[SENTENCES.index("")] == ""
    assert ct2.translate([]) == []


def test_ctranslate2_beam_search_takes_the_configs_beam_and_alpha(exported):
    translator, path = exported
    config = dataclasses.replace(translator.config, beam_size=4, alpha=0.6, max_output_ratio=1.5, max_output_extra=10)
    ct2 = CTranslate2Translator(path, tokenizers=translator.tokenizers, config=config)
    sources = [ids for ids in ct2._source_ids(tf.constant(SENTENCES))[0].to_list() if len(ids) > 2]
    bounds = output_bounds(np.array([len(ids) - 2 for ids in sources]), config, ct2.max_length)
    tokens = [[ct2.src_tokens[i] for i in ids] for ids in sources]

    def direct(beam):  # CTranslate2 called by hand, in the translator's batches, cut at each row's bound as it does
        results = ct2.translator.translate_batch(tokens, max_batch_size=ct2.batch_size, batch_type="examples",
                                                 beam_size=beam, length_penalty=0.6, return_end_token=True,
                                                 max_decoding_length=int(bounds.max()), suppress_sequences=SUPPRESSED)
        return [[ct2.tgt_ids[t] for t in r.hypotheses[0]][:n] for r, n in zip(results, bounds)]

    assert direct(4) != direct(1)  # beam search finds other outputs on this model: the test can tell
    assert ct2.translate_ids(sources) == direct(4)


def test_ctranslate2_int8_loads_and_translates_every_row(exported):
    _, path = exported
    texts, lengths = CTranslate2Translator(path, compute_type="int8").translate_with_lengths(SENTENCES)
    assert len(texts) == len(SENTENCES) and (lengths >= 0).all()


def test_export_command_writes_ctranslate2_and_refuses_errors(tiny_run, tmp_path, capsys):
    main = script_main("export")
    output = tmp_path / "ct2"
    assert main(["--run", str(tiny_run), "--output", str(output), "--format", "ctranslate2"]) == 0
    assert (output / "model.bin").is_file() and (output / "tokenizers" / "saved_model.pb").is_file()
    assert CTranslate2Translator(output).translate(["Deus é amor."])[0] is not None
    assert main(["--run", str(tiny_run), "--output", str(output), "--format", "ctranslate2"]) == 2
    assert "error: " in capsys.readouterr().err
    assert main(["--run", str(tiny_run), "--output", str(tmp_path / "b"), "--format", "ctranslate2",
                 "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "error: --dtype bfloat16" in err and "Traceback" not in err
    assert main(["--run", str(tiny_run), "--output", str(tmp_path / "beam"), "--format", "ctranslate2",
                 "--beam", "4", "--alpha", "0.6"]) == 0
    assert CTranslate2Translator(tmp_path / "beam").config.beam_size == 4  # the export's decoding travels with it


def test_open_translator_decodes_a_ctranslate2_export_in_its_compute_type(exported, tmp_path):
    from transformer.base.errors import ConfigError
    from transformer.inference.export import decode_config_of, open_translator

    translator, path = exported
    opened = open_translator(path)
    assert isinstance(opened, CTranslate2Translator) and opened.compute_type == "float32"
    assert opened.batch_size == translator.config.chunk_size == 4  # batches as our translator chunks
    assert opened.threads["intra_threads"] == 1 and opened.threads["inter_threads"] >= 1
    assert opened.translate(SENTENCES) == translator.translate(SENTENCES)
    assert decode_config_of(path, DecodeConfig(cut_over=0)) == translator.config  # as exported, not the flags
    assert open_translator(path, compute_type="int8").compute_type == "int8"
    with pytest.raises(ConfigError, match="--compute-type int8: .* is not a CTranslate2 export"):
        open_translator(tmp_path, compute_type="int8")


def test_translate_command_takes_a_ctranslate2_export_and_refuses_what_it_cannot_do(exported, tiny_run, tmp_path,
                                                                                    capsys):
    translator, path = exported
    main = script_main("translate")
    assert main(["--model", str(path), "--compute-type", "int8", *SENTENCES[:2]]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["--model", str(path), *SENTENCES[:2]]) == 0
    assert capsys.readouterr().out.splitlines() == translator.translate(SENTENCES[:2])
    assert main(["--model", str(tiny_run), "--compute-type", "int8", "Deus é amor."]) == 2
    err = capsys.readouterr().err
    assert "error: --compute-type int8:" in err and "Traceback" not in err
    assert main(["--model", str(path), "Deus é amor.", "--plot-attention", str(tmp_path / "a.png")]) == 2
    err = capsys.readouterr().err
    assert "error: --plot-attention:" in err and "Traceback" not in err and not (tmp_path / "a.png").exists()


def test_evaluate_command_scores_a_ctranslate2_export_and_names_its_compute_type(exported, tmp_path):
    translator, path = exported
    src, ref, report = tmp_path / "src.pt", tmp_path / "ref.en", tmp_path / "eval.json"
    texts = [s for s in SENTENCES[:5] if s]  # evaluation pairs have both sides
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    ref.write_text("\n".join(translator.translate(texts)) + "\n", encoding="utf-8")  # ours as the reference
    argv = ["--model", str(path), "--src", str(src), "--ref", str(ref), "--repeats", "0", "--output", str(report)]
    assert script_main("evaluate")([*argv, "--compute-type", "float32"]) == 0
    out = json.loads(report.read_text())
    assert out["translations"] == translator.translate(texts) and out["ctranslate2"]["compute_type"] == "float32"
    assert out["bleu"] == pytest.approx(100.0)  # its translations are the references
    assert out["ctranslate2"]["intra_threads"] == 1 and out["exported_decode"]["cut_over"] == 8
    assert script_main("evaluate")([*argv, "--compute-type", "int8"]) == 0
    assert json.loads(report.read_text())["ctranslate2"]["compute_type"] == "int8"


def test_compare_engines_interleaves_and_counts_identical_outputs(exported):
    from transformer.inference.evaluation import compare_engines, comparison_table

    translator, path = exported
    ct2 = CTranslate2Translator(path, tokenizers=translator.tokenizers)
    calls = []

    def logged(name, fn):
        def run(sentences):
            calls.append(name)
            return fn(sentences)
        return run

    def wrong(sentences):
        texts, lengths = translator.translate_with_lengths(sentences)
        return ["?"] + texts[1:], lengths

    engines = {"ours": logged("ours", translator.translate_with_lengths), "ct2": logged("ct2", ct2.translate_with_lengths),
               "wrong": logged("wrong", wrong)}
    report = compare_engines(engines, SENTENCES[:6], repeats=2)
    assert calls == ["ours", "ct2", "wrong"] * 3  # warm-up, then passes interleaved
    assert report["reference"] == "ours" and report["engines"]["ours"]["ratio"] == 1.0
    assert report["engines"]["ct2"]["identical"] == 6 and report["engines"]["wrong"]["identical"] == 5
    assert report["engines"]["ct2"]["best"]["tokens_per_s"] > 0
    assert "| ct2 |" in comparison_table(report) and "6/6" in comparison_table(report)


def test_benchmark_decoding_compare_ctranslate2(tiny_run, tmp_path, capsys):
    output, saved = tmp_path / "comparison.json", tmp_path / "saved"
    # Timed too (--exports): any SavedModel of the run; one decoding loop makes it the cheapest to export.
    assert script_main("export")(["--run", str(tiny_run), "--output", str(saved), "--streams", "1"]) == 0
    argv = ["--run", str(tiny_run), "--compare", "ctranslate2", "--limit", "6", "--repeats", "1", "--chunk-size", "4",
            "--ours", "export", "in-memory", "export-beam4", "--exports", str(saved), "--output", str(output),
            "--ct2-inter-threads", "1", "2", "--ct2-beam-sizes", "1", "4", "--threads", "2"]
    assert script_main("benchmark_decoding")(argv) == 0
    report = json.loads(output.read_text())
    engines = report["engines"]
    assert list(engines) == ["ours SavedModel", "ours in-memory", "ours SavedModel beam 4", f"SavedModel {saved}",
                             *(f"CTranslate2 {compute}{beam}{threads}" for compute in ("float32", "int8")
                               for threads in ("", ", 2 × 1 threads") for beam in ("", " beam 4"))]
    assert engines["CTranslate2 int8 beam 4, 2 × 1 threads"]["settings"]["beam_size"] == 4
    assert engines["CTranslate2 float32, 2 × 1 threads"]["settings"]["inter_threads"] == 2
    assert engines["CTranslate2 float32, 2 × 1 threads"]["identical"] == 6
    assert engines["ours SavedModel beam 4"]["settings"]["beam_size"] == 4
    assert not engines["ours SavedModel"]["settings"]["jit_compile"]  # --xla follows DecodeConfig: off
    for name in ("ours SavedModel", f"SavedModel {saved}", "CTranslate2 int8"):  # loaded here: cold start timed
        cold = engines[name]["cold_start"]
        assert cold["load_s"] > 0 and cold["first_batch_s"] > 0 and cold["total_s"] >= cold["load_s"]
        assert cold["second_batch_s"] > 0
    assert "cold_start" not in engines["ours in-memory"]
    assert all(0 <= engine["bleu"] <= 100 for engine in engines.values())
    assert engines["ours in-memory"]["identical"] == 6 and engines["CTranslate2 float32"]["identical"] == 6
    assert engines[f"SavedModel {saved}"]["identical"] == 6
    assert report["machine"]["load_average"] and "CTranslate2 int8" in capsys.readouterr().out


def test_benchmark_decoding_streams_probe_gives_the_same_translations(tiny_run, tmp_path, capsys):
    output = tmp_path / "streams.json"
    argv = ["--run", str(tiny_run), "--streams-probe", "--limit", "9", "--repeats", "1", "--chunk-sizes", "2",
            "--streams", "1", "2", "--output", str(output)]
    assert script_main("benchmark_decoding")(argv) == 0
    report = json.loads(output.read_text())
    engines = report["engines"]
    assert list(engines) == ["batch 2: 1 concurrent call", "batch 2: 2 concurrent calls", "batch 2: export, 1 stream",
                             "batch 2: export, 2 streams"]
    assert all(engine["identical"] == 9 for engine in engines.values())  # concurrency changes no translation
    assert all(engine["cores_busy"] > 0 for engine in engines.values())
    assert report["dtype"] == "float32" and report["threads"]["inter_op"] >= 0
    assert "2 concurrent calls" in capsys.readouterr().out
