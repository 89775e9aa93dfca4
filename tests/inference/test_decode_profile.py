"""The decode-time breakdown: every part measured, the parts adding up to the whole.

The models are one-layer tiny ones and the sentences decode in two chunks: every timed part
is traced once per chunk shape, so layers and chunks are what the breakdown's cost grows with."""

import functools

import pytest
from helpers_translation import tiny_translator

from transformer.inference.decode_profile import decode_time_breakdown, format_breakdown, translator_chunks
from transformer.inference.translator import DecodeConfig, Translator

SENTENCES = ["No princípio, Deus criou os céus e a terra.", "Deus é amor.", "", "Jesus chorou.",
             "E disse Deus: Haja luz; e houve luz.", "E viu Deus que era boa a luz."]
CHUNK_SIZE = 3  # the 5 sentences with tokens: chunks of 3 and 2


def one_layer_translator(head_width: str = "tutorial", **config) -> Translator:
    """`tiny_translator` with one layer and chunks of `CHUNK_SIZE` (`config`: more DecodeConfig fields)."""
    return tiny_translator(DecodeConfig(chunk_size=CHUNK_SIZE, **config), num_layers=1, head_width=head_width)


@pytest.fixture(scope="module")
def greedy():
    """head_width → (one-layer translator, its greedy breakdown), each computed once per module:
    the parts test checks both, the beam test decodes the same chunks with the "tutorial" model."""
    def breakdown(head_width: str) -> tuple:
        translator = one_layer_translator(head_width)
        return translator, decode_time_breakdown(translator, SENTENCES, repeats=1)

    return functools.cache(breakdown)


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])  # input cache, key/value cache
def test_breakdown_parts_add_up(head_width, greedy):
    translator, breakdown = greedy(head_width)
    chunks = translator_chunks(translator, SENTENCES)
    assert [int(c.shape[0]) for c in chunks] == [3, 2]  # the empty sentence is not decoded
    seconds = breakdown["seconds"]
    for part in ("tokenize", "encoder", "decoder_steps", "projection", "cache_update", "selection", "detokenize",
                 "decode_loop"):
        assert seconds[part] > 0, part
    assert breakdown["steps"] > 0 and breakdown["chunks"] == 2
    assert abs(sum(breakdown["share"].values()) - 1) < 0.01
    assert "| loop_overhead |" in format_breakdown(breakdown)


def test_beam_breakdown_adds_up_and_runs_at_least_greedy_steps(greedy):
    """Beam search (the step on the by-slot cache with a lineage): every part is timed, the
    parts add up, and it runs at least greedy's steps on the same chunks."""
    translator, greedy_breakdown = greedy("tutorial")
    beam = decode_time_breakdown(translator.with_config(beam_size=3), SENTENCES, repeats=2)
    assert beam["beam_size"] == 3 and min(beam["seconds"][p] for p in ("decoder_steps", "cache_update")) > 0
    assert abs(sum(beam["share"].values()) - 1) < 0.01
    assert beam["steps"] >= greedy_breakdown["steps"] > 0


def test_breakdown_refuses_xla():
    with pytest.raises(ValueError, match="without XLA"):
        decode_time_breakdown(one_layer_translator(jit_compile=True), SENTENCES)


def test_benchmark_decoding_profile_command(tiny_run, tmp_path, capsys):
    import json

    from conftest import script_main

    output = tmp_path / "profile.json"
    # One chunk of 3 sentences: the command's wiring is under test here, not the chunking.
    argv = ["--run", str(tiny_run), "--profile", "--limit", "3", "--repeats", "1", "--chunk-size", "3",
            "--output", str(output)]
    assert script_main("benchmark_decoding")(argv) == 0
    report = json.loads(output.read_text())
    assert report["steps"] > 0 and report["machine"]["cpu"] and "| decoder_layers |" in capsys.readouterr().out
    assert script_main("benchmark_decoding")(argv + ["--compare", "ctranslate2"]) == 2
    assert "error: --compare, --profile and --streams-probe" in capsys.readouterr().err
    assert script_main("benchmark_decoding")(argv + ["--beam", "2", "--dtype", "bfloat16"]) == 0
    report = json.loads(output.read_text())
    assert report["beam_size"] == 2 and report["dtype"] == "bfloat16" and "| selection |" in capsys.readouterr().out
    assert script_main("benchmark_decoding")([a for a in argv if a != "--profile"] + ["--beam", "2"]) == 2
    assert "error: --beam" in capsys.readouterr().err
