"""ContinuousDecoder: sentences joining and leaving a running batch decode what the offline translator decodes."""

import pytest
import tensorflow as tf
from helpers_translation import BAD_INPUTS, CAPITALS_INPUTS

from transformer.inference.export import load_exported
from transformer.inference.stepping import ContinuousDecoder, translator_from_saved
from transformer.inference.translator import DecodeConfig

MAX_LENGTH = 24
SENTENCES = ["Deus é amor.", "No princípio era o Verbo.", "E disse Deus: Haja luz.", "Jesus chorou.", "a b c",
             "Bem-aventurados os pacificadores, porque eles serão chamados filhos de Deus."]


@pytest.fixture(scope="module")
def translator(tiny_export):
    """The session's tiny translator (chunks of 4, max_length MAX_LENGTH); its export is tiny_export's."""
    translator = tiny_export[0]
    assert translator.model.config.max_length == MAX_LENGTH
    return translator


def rows_of(translator, sentences) -> int:
    """Decoder rows the sentences make: one each, more for one over the model's length (cut into pieces)."""
    return int(tf.size(translator.pieces(tf.constant(sentences))[1]))


def drive(decoder, arrivals):
    """Adds arrivals[k] (a list of sentences) before step k; steps until every row ended → {index: text}."""
    out, index, k = {}, 0, 0
    while k < len(arrivals) or decoder.active:
        if k < len(arrivals):
            batch = arrivals[k]
            decoder.add(batch, list(range(index, index + len(batch))))
            index += len(batch)
        k += 1
        for key, text in decoder.step():
            assert key not in out
            out[key] = text
    return out


@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_sentences_joining_between_steps_decode_as_offline(translator, steps_per_call):
    sentences = SENTENCES + BAD_INPUTS + CAPITALS_INPUTS
    reference = translator.translate(sentences)
    decoder = ContinuousDecoder(translator, steps_per_call=steps_per_call)
    # Joining at different steps, some while others are half-way: positions, masks and the
    # source padding of the shared batch differ from the offline chunks.
    arrivals = [sentences[:2], [], sentences[2:3], sentences[3:9], [], [], sentences[9:10], sentences[10:]]
    out = drive(decoder, arrivals)
    assert [out[i] for i in range(len(sentences))] == reference
    assert decoder.active == 0 and decoder.row_steps < decoder.steps * rows_of(translator, sentences)


def test_rows_leave_when_they_end_and_empty_sources_translate_to_empty(translator):
    decoder = ContinuousDecoder(translator)
    long = "palavra " * 40  # bounded by MAX_LENGTH tokens: outlives the empty rows' 10
    decoder.add(["", long, "   "], ["empty", "long", "blank"])
    out, active = {}, []
    while decoder.active:
        out.update(decoder.step())
        active.append(decoder.active)
    assert out == {"empty": "", "blank": "", "long": translator.translate([long])[0]}
    assert 1 in active  # the empty rows left while the long one went on


def test_an_ended_row_left_in_the_batch_past_max_length_does_not_disturb_the_others(translator):
    decoder = ContinuousDecoder(translator)
    first = "Jesus chorou e disse"
    long = ["palavra " * 40, "Deus " * 30, "a b " * 20]  # each bounded by MAX_LENGTH tokens
    # `first` ends first and stays (fewer than half the rows ended) while the long rows, one
    # step younger, decode up to MAX_LENGTH steps: its column distance passes max_length.
    out = drive(decoder, [[first], long])
    assert [out[i] for i in range(4)] == translator.translate([first, *long])


def test_a_call_decodes_several_steps_and_drops_what_follows_a_rows_end(translator):
    decoder = ContinuousDecoder(translator, steps_per_call=5)
    sentences = ["Jesus chorou.", "palavra " * 40]  # the second bounded by MAX_LENGTH tokens
    decoder.add(sentences, [0, 1])
    out = dict(decoder.step())
    assert decoder.steps == 5 and decoder.row_steps == 10
    while decoder.active:
        out.update(decoder.step())
    assert [out[0], out[1]] == translator.translate(sentences)  # no token of a call after a row's end kept


def test_a_call_stops_once_every_row_has_ended(translator):
    decoder = ContinuousDecoder(translator)
    decoder.add(SENTENCES, list(range(len(SENTENCES))))
    ids, ended, _ = decoder._advance(decoder._state, tf.constant(10 * MAX_LENGTH))
    assert ids.shape[0] == rows_of(translator, SENTENCES) and ids.shape[1] <= MAX_LENGTH  # not 10 * MAX_LENGTH steps
    assert ended.numpy()[:, -1].all() and not ended.numpy()[:, -2].all()


def test_a_rebuilt_export_decodes_as_the_export(tiny_export):
    exported = load_exported(tiny_export[1])
    decoder = ContinuousDecoder(translator_from_saved(exported.module, exported.manifest))
    assert decoder.translate(SENTENCES) == exported.translate(SENTENCES)


def test_beam_search_and_xla_are_refused(translator):
    for config in (DecodeConfig(beam_size=4), DecodeConfig(jit_compile=True)):
        with pytest.raises(ValueError, match="greedily without XLA"):
            ContinuousDecoder(translator.with_config(**config.to_dict()))
