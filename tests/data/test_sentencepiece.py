"""SentencePiece unigram tokenizers (`--tokenizer sentencepiece`) and subword regularisation:
the same reserved ids and detokenization contract as WordPiece, sampled segmentations that
change from pass to pass but detokenize to the same text, deterministic evaluation batches,
and the SavedModel in a fresh process with tensorflow + tensorflow_text only."""

import json
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
from helpers_process import run_without_project
from helpers_translation import shared_tokenizers

from transformer.base.config import PipelineConfig
from transformer.base.constants import END_ID, PAD_ID, RESERVED_TOKENS, START_ID, UNK_ID
from transformer.data.pipeline import make_batches, tokenize_pairs

SAMPLING = (64, 0.1)  # (nbest, alpha)


@pytest.fixture(scope="module")
def built():
    tokenizers, directory, config, corpus = shared_tokenizers("sentencepiece")
    pairs = [(s.decode(), t.decode()) for s, t in corpus.train.take(300).as_numpy_iterator()]
    return tokenizers, directory, config, pairs


def texts(built, side):
    return [pair[side] for pair in built[3]]


def decode(strings) -> list[str]:
    return [s.decode() for s in strings.numpy()]


@pytest.mark.parametrize("lang,side", [("src", 0), ("tgt", 1)])
def test_round_trip_gives_the_normalised_sentence_with_reserved_ids(built, lang, side):
    tokenizer = getattr(built[0], lang)
    sentences = texts(built, side)
    ids = tokenizer.tokenize(sentences)
    for row in ids.to_list():
        assert row[0] == START_ID and row[-1] == END_ID
        assert START_ID not in row[1:-1] and END_ID not in row[1:-1] and PAD_ID not in row
    expected = [" ".join(unicodedata.normalize("NFKC", s).lower().split()) for s in sentences]  # lower-cased config
    assert decode(tokenizer.detokenize(ids)) == expected
    assert decode(tokenizer.detokenize(ids.to_tensor())) == expected  # [PAD] decodes to nothing
    assert list(tokenizer.get_reserved_tokens().numpy().astype(str)) == list(RESERVED_TOKENS)
    assert [p.decode() for p in tokenizer.lookup(tf.constant([[0, 1, 2, 3]], tf.int64)).numpy()[0]] == list(
        RESERVED_TOKENS)
    if lang == "src":  # accents are kept (only WordPiece's lower-casing strips them)
        assert any(ch in text for text in expected for ch in "çãéó")


def test_an_unknown_character_decodes_to_unk(built):
    tgt = built[0].tgt
    ids = tgt.tokenize(["and god said 你"]).to_list()[0]
    assert UNK_ID in ids
    assert decode(tgt.detokenize(tf.ragged.constant([ids], tf.int64))) == ["and god said [UNK]"]


def test_sampled_segmentations_differ_between_calls_and_detokenize_to_the_same_text(built):
    tokenizers = built[0]
    nbest, alpha = tf.constant(SAMPLING[0]), tf.constant(SAMPLING[1])
    for lang, side in (("src", 0), ("tgt", 1)):
        tokenizer, sentences = getattr(tokenizers, lang), texts(built, side)[:100]
        best = tokenizer.tokenize(sentences).to_list()
        draws = [tokenizer.tokenize_sampled(sentences, nbest, alpha) for _ in range(2)]
        first, second = (draw.to_list() for draw in draws)
        assert sum(a != b for a, b in zip(first, second)) > 20, lang  # most sentences change
        assert sum(a != b for a, b in zip(first, best)) > 20, lang
        expected = decode(tokenizer.detokenize(tf.ragged.constant(best, tf.int64)))
        for draw in draws:
            assert decode(tokenizer.detokenize(draw)) == expected
        assert tokenizer.tokenize(sentences).to_list() == best  # the deterministic segmentation stays


def _string_pairs(built):
    return tf.data.Dataset.from_tensor_slices((texts(built, 0), texts(built, 1)))


def _passes(dataset, count=2):
    return [[(s.tolist(), t.tolist()) for s, t in dataset.as_numpy_iterator()] for _ in range(count)]


def test_each_pass_of_the_training_pairs_samples_anew(built):
    tokenizers = built[0]
    sampled = tokenize_pairs(_string_pairs(built), tokenizers, max_length=512, sampling=SAMPLING)  # no truncation
    first, second = _passes(sampled)
    assert len(first) == len(second) == len(built[3])
    assert sum(a != b for a, b in zip(first, second)) > len(first) // 4
    for lang, side in (("src", 0), ("tgt", 1)):  # the same sentences, in order: the same text
        detokenize = getattr(tokenizers, lang).detokenize
        expected = decode(detokenize(getattr(tokenizers, lang).tokenize(texts(built, side))))
        for one_pass in (first, second):
            assert decode(detokenize(tf.ragged.constant([pair[side] for pair in one_pass], tf.int64))) == expected
    fixed = tokenize_pairs(_string_pairs(built), tokenizers, max_length=512)
    once, again = _passes(fixed)
    assert once == again
    assert sum(a != b for a, b in zip(first, once)) > len(first) // 4


def test_validation_batches_are_deterministic_and_training_batches_sampled(built):
    tokenizers = built[0]
    config = PipelineConfig(max_tokens=512, subword_alpha=SAMPLING[1], subword_nbest=SAMPLING[0], shuffle_buffer=1)
    plain = PipelineConfig(max_tokens=512, shuffle_buffer=1)

    def batches(pipeline, training):
        data = make_batches(_string_pairs(built), tokenizers, pipeline, max_length=64, training=training, seed=0)
        return [tuple(np.asarray(x).tolist() for x in (src, tgt_in, tgt_out))
                for (src, tgt_in), tgt_out in data.as_numpy_iterator()]

    evaluation = batches(config, training=False)
    assert evaluation == batches(config, training=False) == batches(plain, training=False)
    assert batches(plain, training=True) == batches(plain, training=True)
    assert batches(config, training=True) != batches(config, training=True)


def test_sampling_needs_sentencepiece_tokenizers(built):
    wordpiece = shared_tokenizers("wordpiece")[0]
    with pytest.raises(ValueError, match="--tokenizer sentencepiece"):
        tokenize_pairs(_string_pairs(built), wordpiece, max_length=64, sampling=SAMPLING)


def test_directory_holds_the_models_and_the_manifest_says_sentencepiece(built):
    _, directory, config, _ = built
    assert f"-sp{config.vocab_size}-" in directory.name
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["algorithm"] == "sentencepiece"
    for lang in ("src", "tgt"):
        vocab = (directory / f"{lang}_vocab.txt").read_text(encoding="utf-8").splitlines()
        assert vocab[: len(RESERVED_TOKENS)] == list(RESERVED_TOKENS) and len(vocab) == manifest[f"{lang}_vocab_size"]
        assert (directory / f"{lang}.model").stat().st_size > 0


def test_saved_model_in_a_fresh_process_tokenizes_each_language_with_its_own_model(built):
    """Only tensorflow + tensorflow_text; the two sides must not share one restored model."""
    tokenizers, directory = built[0], built[1]
    sentence = texts(built, 0)[0]
    script = (
        "import json, sys\n"
        "import tensorflow as tf, tensorflow_text\n"
        "module = tf.saved_model.load(sys.argv[1])\n"
        "s = tf.constant([sys.argv[2]])\n"
        "src, tgt = module.src.tokenize(s), module.tgt.tokenize(s)\n"
        "print(json.dumps({'src': src.to_list(), 'tgt': tgt.to_list(), 'text': module.src.detokenize(src).numpy()[0].decode(),\n"
        "                  'transformer': any(m.startswith('transformer') for m in sys.modules)}))\n"
    )
    output = run_without_project(script, str(directory), sentence, cwd=directory.parent)
    assert output["src"] == tokenizers.src.tokenize([sentence]).to_list()
    assert output["tgt"] == tokenizers.tgt.tokenize([sentence]).to_list()
    assert output["src"] != output["tgt"]  # a Portuguese sentence: the English model segments it otherwise
    assert output["text"] == decode(tokenizers.src.detokenize(tokenizers.src.tokenize([sentence])))[0]
    assert output["transformer"] is False
