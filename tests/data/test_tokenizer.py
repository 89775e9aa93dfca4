"""WordPiece tokenizers learned from the shared Bible corpus: round trip, reserved tokens,
the SavedModel in a fresh process, directory keys and incomplete directories."""

import collections
import json
import re
import shutil
import unicodedata

import numpy as np
import pytest
from helpers_process import run_without_project

from transformer.base.config import DataConfig, TokenizerConfig
from transformer.base.constants import END_ID, PAD_ID, RESERVED_TOKENS, START_ID, UNK_ID
from transformer.data import tokenizer as tokenizer_module
from transformer.data.corpora import load_corpus
from transformer.data.tokenizer import TokenizerError, build_or_load_tokenizers, load_tokenizers, tokenizer_key


def lower_strip_accents(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn")


def words_and_punctuation(text: str) -> list:
    """Whitespace-insensitive comparison key that still keeps word boundaries."""
    return re.findall(r"\w+|[^\w\s]", text)


def sentences(built, side: int, count: int, split: str = "train") -> list:
    corpus = built.corpus
    dataset = corpus.train if split == "train" else corpus.validation
    return [pair[side].decode() for pair in dataset.take(count).as_numpy_iterator()]


@pytest.mark.parametrize("lang,side", [("src", 0), ("tgt", 1)])
def test_round_trip_gives_the_normalised_sentence(bible_tokenizers, lang, side):
    tokenizer = getattr(bible_tokenizers.tokenizers, lang)
    texts = sentences(bible_tokenizers, side, 200)
    ids = tokenizer.tokenize(texts)
    back = [b.decode() for b in tokenizer.detokenize(ids).numpy()]
    for text, restored in zip(texts, back):
        assert words_and_punctuation(restored) == words_and_punctuation(lower_strip_accents(text)), text
    if lang == "src":  # the Portuguese side exercised accent stripping
        assert any(ch in text for text in texts for ch in "çãéó")


@pytest.mark.parametrize("lang,side", [("src", 0), ("tgt", 1)])
def test_start_end_added_and_common_words_known(bible_tokenizers, lang, side):
    tokenizer = getattr(bible_tokenizers.tokenizers, lang)
    texts = sentences(bible_tokenizers, side, 50, split="validation")  # not seen when learning
    ids = tokenizer.tokenize(texts)
    for row in ids.to_list():
        assert row[0] == START_ID and row[-1] == END_ID
        assert START_ID not in row[1:-1] and END_ID not in row[1:-1] and PAD_ID not in row

    counts = collections.Counter(w for t in sentences(bible_tokenizers, side, 1500)
                                 for w in re.findall(r"\w+", lower_strip_accents(t)))
    common = [w for w, _ in counts.most_common(100)]
    word_ids = tokenizer.tokenize(common).to_list()
    assert all(UNK_ID not in row for row in word_ids), [w for w, row in zip(common, word_ids) if UNK_ID in row]
    vocab = [v.decode() for v in tokenizer.lookup(ids).flat_values.numpy()]
    assert vocab.count("[UNK]") < 0.01 * len(vocab)
    assert list(tokenizer.get_reserved_tokens().numpy().astype(str)) == list(RESERVED_TOKENS)


def test_detokenize_drops_reserved_tokens(bible_tokenizers):
    tgt = bible_tokenizers.tokenizers.tgt
    ids = tgt.tokenize(["And God said."]).to_tensor().numpy()
    padded = np.concatenate([ids, np.zeros((1, 3), ids.dtype)], axis=1)
    assert tgt.detokenize(padded).numpy()[0].decode() == "and god said."


SPACED_AS_WRITTEN = [  # (words as the model emits them, space-separated) → the sentence as English writes it
    ('God said , " Let there be light , " and there was light .', 'God said, "Let there be light," and there was light.'),
    ('" I am a stranger . "', '"I am a stranger."'),
    ("the way . \" He said , \" You said , ' Go . ' \"", "the way.\" He said, \"You said, 'Go.'\""),
    ('He said : " Go ! " They went', 'He said: "Go!" They went'),
    ("\" ' Will I ? ' \"", "\"'Will I?'\""),
    ("the Lord ' s house ; don ' t fear your fathers ' houses", "the Lord's house; don't fear your fathers' houses"),
    ("seventy - seven times , his daughter - in - law , a - b - c", "seventy-seven times, his daughter-in-law, a-b-c"),
    ("( see the book ) [ of Jashar ]", "(see the book) [of Jashar]"),
    ('José disse , " Éramos doze . "', 'José disse, "Éramos doze."'),
    ("1 , 500 , 000 people paid $ 3 . 50 , 20 % more , at 10 : 30 ( John 3 : 16 )",
     "1,500,000 people paid $3.50, 20% more, at 10:30 (John 3:16)"),
    ("verses 1 , 2 , 3 and 12 , 40 - 42 ; 7 . The", "verses 1, 2, 3 and 12, 40-42; 7. The"),
    ("", ""),
]


@pytest.mark.parametrize("spaced,written", SPACED_AS_WRITTEN)
def test_words_are_spaced_as_english_writes_them(spaced, written):
    assert tokenizer_module._join_words([spaced]).numpy()[0].decode() == written
    # lower-cased words: no capital tells an opening quote, a letter after `,` `:` `(` does
    lowered = tokenizer_module._join_words([spaced.lower()], lower_case=True).numpy()[0].decode()
    assert lowered == written.lower()


def test_references_detokenize_to_themselves(bible_tokenizers):
    """Tokenized and detokenized, the English sentences come back as written (lower-cased,
    accents stripped: the session tokenizers' normalisation), quotes and hyphens included."""
    tgt = bible_tokenizers.tokenizers.tgt
    texts = [lower_strip_accents(text) for text in sentences(bible_tokenizers, 1, 1500)]
    ids = tgt.tokenize(texts)
    known = [i for i, row in enumerate(ids.to_list()) if UNK_ID not in row]  # an [UNK] cannot come back
    back = [b.decode() for b in tgt.detokenize(ids).numpy()]
    with_quote = [i for i in known if '"' in texts[i] or "'" in texts[i]]
    assert len(known) > 100 and len(with_quote) > 30
    assert sum(back[i] == texts[i] for i in known) >= 0.95 * len(known)  # 0.57 with the rules before
    assert sum(back[i] == texts[i] for i in with_quote) >= 0.85 * len(with_quote)  # 0.19 before


def test_tokenizers_saved_with_older_spacing_rules_load_with_todays(bible_tokenizers, tmp_path, monkeypatch):
    """A run's tokenizers saved before `JOIN_RULES` 2 hold the old spacing in their graph:
    loaded, they tokenize with that graph (the same ids) and detokenize by today's rules, also
    once saved again (as inside an export) and reloaded."""
    import tensorflow as tf

    def rules_before(text, lower_case=False):  # the spacing of `JOIN_RULES` 1
        text = tf.strings.regex_replace(text, r" ([.,;:!?)\]}])", r"\1")
        text = tf.strings.regex_replace(text, r"([(\[{]) ", r"\1")
        return tf.strings.regex_replace(text, r"(\w) ' (\w)", r"\1'\2")

    directory = bible_tokenizers.directory
    with monkeypatch.context() as patch:
        patch.setattr(tokenizer_module, "_join_words", rules_before)
        old = tokenizer_module.PairTokenizers(str(directory / "src_vocab.txt"), str(directory / "tgt_vocab.txt"),
                                              bible_tokenizers.config.lower_case)
        tf.saved_model.save(old, str(tmp_path / "old"))
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["join_rules"] == tokenizer_module.JOIN_RULES
    del manifest["join_rules"]
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    for name in ("src_vocab.txt", "tgt_vocab.txt"):
        (tmp_path / "old" / name).write_text((directory / name).read_text())

    text = 'and god said, "let there be light," and there was light.'
    raw = tf.saved_model.load(str(tmp_path / "old"))
    assert raw.tgt.detokenize(raw.tgt.tokenize([text])).numpy()[0].decode() != text  # the old spacing
    loaded = load_tokenizers(tmp_path / "old")
    assert isinstance(loaded, tokenizer_module.RejoinedPair)
    ids = loaded.tgt.tokenize([text])
    assert ids.to_list() == raw.tgt.tokenize([text]).to_list()
    assert loaded.src.tokenize(["Olá, mundo."]).to_list() == raw.src.tokenize(["Olá, mundo."]).to_list()
    assert loaded.tgt.detokenize(ids).numpy()[0].decode() == text
    tf.saved_model.save(loaded, str(tmp_path / "again"))  # as inside an export: a SavedModel of its own
    again = tf.saved_model.load(str(tmp_path / "again")).tgt
    assert again.detokenize(again.tokenize([text])).numpy()[0].decode() == text


def test_saved_model_reloads_in_a_fresh_process(bible_tokenizers, tmp_path):
    """Only tensorflow + tensorflow_text: the SavedModel must not need the `transformer` package."""
    tgt = bible_tokenizers.tokenizers.tgt
    texts = sentences(bible_tokenizers, 1, 3, split="validation")
    ids = tgt.tokenize(texts).to_tensor().numpy()
    expected = [b.decode() for b in tgt.detokenize(ids).numpy()]
    script = (
        "import json, sys\n"
        "import tensorflow as tf, tensorflow_text\n"
        "module = tf.saved_model.load(sys.argv[1])\n"
        "ids = tf.constant(json.loads(sys.argv[2]), tf.int64)\n"
        "text = [t.decode() for t in module.tgt.detokenize(ids).numpy()]\n"
        "tokens = module.src.tokenize(tf.constant(['Olá, mundo.'])).to_list()\n"
        "print(json.dumps({'text': text, 'tokens': tokens,\n"
        "                  'transformer': any(m.startswith('transformer') for m in sys.modules)}))\n"
    )
    output = run_without_project(script, str(bible_tokenizers.directory), json.dumps(ids.tolist()), cwd=tmp_path)
    assert output["text"] == expected
    assert output["tokens"] == bible_tokenizers.tokenizers.src.tokenize(["Olá, mundo."]).to_list()
    assert output["transformer"] is False


def test_saving_tokenizers_traces_each_method_once(bible_tokenizers, tmp_path, monkeypatch):
    """Methods are traced inside `tf.saved_model.save` only: not when the tokenizers are made,
    and not again by the save's own re-tracing of each signature. The SavedModel still serves
    every signature: tokenize, detokenize of dense and ragged ids, lookup."""
    import tensorflow as tf

    traced = collections.Counter()
    cls = tokenizer_module.WordPieceTokenizer
    segment, text = cls._segment, cls._text
    monkeypatch.setattr(cls, "_segment", lambda self, s: (traced.update(["tokenize"]), segment(self, s))[1])
    monkeypatch.setattr(cls, "_text", lambda self, ids: (traced.update(["detokenize"]), text(self, ids))[1])
    directory = bible_tokenizers.directory
    module = tokenizer_module.PairTokenizers(str(directory / "src_vocab.txt"), str(directory / "tgt_vocab.txt"),
                                             bible_tokenizers.config.lower_case)
    assert not traced
    tf.saved_model.save(module, str(tmp_path / "saved"))
    assert traced == {"tokenize": 2, "detokenize": 4}  # per language: tokenize; detokenize dense and ragged
    loaded, reference = tf.saved_model.load(str(tmp_path / "saved")), bible_tokenizers.tokenizers
    texts = sentences(bible_tokenizers, 1, 4, split="validation")
    ids = loaded.tgt.tokenize(texts)
    assert ids.to_list() == reference.tgt.tokenize(texts).to_list()

    def plain(t):
        return t.to_list() if isinstance(t, tf.RaggedTensor) else t.numpy().tolist()

    for form in (ids, ids.to_tensor()):
        for method in ("detokenize", "lookup"):
            assert plain(getattr(loaded.tgt, method)(form)) == plain(getattr(reference.tgt, method)(form)), method
    assert int(loaded.src.get_vocab_size()) == int(reference.src.get_vocab_size())


def test_same_inputs_reuse_the_directory(bible_tokenizers, monkeypatch):
    def no_learning(*args, **kwargs):
        raise AssertionError("tokenizers were rebuilt instead of reused")

    loaded = []
    monkeypatch.setattr(tokenizer_module, "learn_vocab", no_learning)
    monkeypatch.setattr(tokenizer_module, "load_tokenizers", lambda directory: loaded.append(directory) or "module")
    root = bible_tokenizers.directory.parent
    before = sorted(p.name for p in root.iterdir())
    corpus = load_corpus(bible_tokenizers.data_config)  # a fresh load of the same data
    tokenizers, directory = build_or_load_tokenizers(corpus, bible_tokenizers.config)
    assert directory == bible_tokenizers.directory and loaded == [directory] and tokenizers == "module"
    assert sorted(p.name for p in root.iterdir()) == before


def test_different_inputs_get_different_keys(tmp_path):
    for name, lines in (("a", ["um", "dois"]), ("b", ["um", "três"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.pt").write_text("\n".join(lines) + "\n")
        (tmp_path / name / "train.en").write_text("one\ntwo\n")
    corpus_a = load_corpus(DataConfig(data_dir=str(tmp_path / "a")))
    corpus_b = load_corpus(DataConfig(data_dir=str(tmp_path / "b")))
    config = TokenizerConfig(vocab_size=1000)
    key = tokenizer_key(corpus_a, config)
    assert tokenizer_key(load_corpus(DataConfig(data_dir=str(tmp_path / "a"))), config) == key  # deterministic
    others = [
        tokenizer_key(corpus_a, TokenizerConfig(vocab_size=2000)),
        tokenizer_key(corpus_a, TokenizerConfig(vocab_size=1000, lower_case=not config.lower_case)),
        tokenizer_key(corpus_a, TokenizerConfig(vocab_size=1000, learn_max_examples=1)),
        tokenizer_key(corpus_b, config),
        tokenizer_key(load_corpus(DataConfig(data_dir=str(tmp_path / "a"), max_train_examples=1)), config),
    ]
    assert len({key, *others}) == 1 + len(others)
    assert tokenizer_key(corpus_a, TokenizerConfig(vocab_size=1000, root="elsewhere")) == key  # root is not identity


@pytest.mark.parametrize("missing", [("variables",), ("manifest.json",), ("saved_model.pb", "tgt_vocab.txt")])
def test_incomplete_directory_names_what_is_missing(bible_tokenizers, tmp_path, missing):
    copy = tmp_path / "copy"
    shutil.copytree(bible_tokenizers.directory, copy)
    load_tokenizers(copy)  # the complete copy loads
    for name in missing:
        target = copy / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(TokenizerError) as err:
        load_tokenizers(copy)
    assert str(copy) in str(err.value)
    for name in missing:
        assert name in str(err.value)


def test_missing_directory_and_wrong_format_are_errors(bible_tokenizers, tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizers(tmp_path / "absent")
    copy = tmp_path / "copy"
    shutil.copytree(bible_tokenizers.directory, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format"] = 999
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TokenizerError, match="format 999"):
        load_tokenizers(copy)


def test_manifest_records_the_build(bible_tokenizers):
    manifest = json.loads((bible_tokenizers.directory / "manifest.json").read_text())
    assert manifest["lower_case"] is True
    assert manifest["vocab_size_requested"] == bible_tokenizers.config.vocab_size
    assert manifest["corpus"]["fingerprint"] == bible_tokenizers.corpus.fingerprint
    for lang in ("src", "tgt"):
        vocab = (bible_tokenizers.directory / f"{lang}_vocab.txt").read_text(encoding="utf-8").splitlines()
        assert vocab[: len(RESERVED_TOKENS)] == list(RESERVED_TOKENS)
        assert len(vocab) == manifest[f"{lang}_vocab_size"]
        assert int(getattr(bible_tokenizers.tokenizers, lang).get_vocab_size()) == len(vocab)


@pytest.mark.parametrize("side,vocab_size", [("pt", 400), ("en", 250)])
def test_fast_wordpiece_learner_equals_tensorflow_texts(bible_dir, side, vocab_size):
    """transformer.data.wordpiece.learn gives exactly the library's vocabulary (same tokens, same order)."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as library

    from transformer.data import wordpiece

    lines = (bible_dir / f"train.{side}").read_text(encoding="utf-8").splitlines()[:600]
    counts = collections.Counter(word for line in lines for word in re.findall(r"\w+|[^\w\s]", line))
    counts.update({"##": 40, "a##b": 30, "#x#": 25, "ab##c": 12})  # words that look like joined pieces
    reserved = list(RESERVED_TOKENS)
    assert wordpiece.learn(counts, vocab_size, reserved) == library.learn(counts, vocab_size, reserved)
    assert wordpiece.learn(counts, 50, reserved, num_iterations=2) == library.learn(counts, 50, reserved,
                                                                                   num_iterations=2)


EDGE_TEXTS = ["", "  ", "e\u0301 decomposta", "ﬁm Straße İSTAMBUL", "😀👍🏽 ok", "ctrl\x01\x07x\u200by", "tab\tline\n",
              "中文 日本語", "a" * 150, "x" + "é" * 60, "[UNK] [START]", "C'est «citação» “aspas” …", "１２３ ＡＢＣ",
              "e-mail@x.com http://a.b/c?d=e", "Jesus' won't"]


@pytest.mark.parametrize("lower_case", [False, True])
def test_wordpiece_segments_as_berttokenizer(bible_tokenizers, bible_dir, lower_case):
    """The fast segmentation gives `BertTokenizer`'s ids (with its normalisation) on corpus lines
    and odd text, and splits words at a no-break or ideographic space, where BertTokenizer
    made the words it joins one [UNK]."""
    import tensorflow as tf
    import tensorflow_text as tf_text

    vocab_path = str(bible_tokenizers.directory / "src_vocab.txt")
    ours = tokenizer_module.WordPieceTokenizer(vocab_path, lower_case)
    bert = tf_text.BertTokenizer(vocab_path, **tokenizer_module._bert_params(lower_case))
    lines = (bible_dir / "train.pt").read_text(encoding="utf-8").splitlines()[:3000] + EDGE_TEXTS
    expected = bert.tokenize(tf.constant(lines)).merge_dims(-2, -1).to_list()
    assert ours.tokenize(tf.constant(lines)).to_list() == [[START_ID, *ids, END_ID] for ids in expected]
    spaced = ours.tokenize(tf.constant(["Deus é amor", "Deus\u00a0é\u3000amor"])).to_list()
    assert spaced[0] == spaced[1] and len(spaced[1]) > 3
