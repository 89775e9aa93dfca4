"""Corpus sources and validation: local files (explicit or `--data DIR`), TFDS under
`tfds.testing.mock_data` (no network), and the error messages that name the culprit."""

from pathlib import Path

import pytest
import tensorflow as tf

from transformer.base.config import DataConfig
from transformer.data.corpora import CorpusError, load_corpus, read_parallel_files


def write(path: Path, lines, newline_at_end=True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if newline_at_end else ""), encoding="utf-8")
    return path


def pairs(dataset: tf.data.Dataset) -> list:
    return [(s.decode(), t.decode()) for s, t in dataset.as_numpy_iterator()]


def test_missing_file_is_named(tmp_path):
    src = write(tmp_path / "train.pt", ["olá"])
    with pytest.raises(CorpusError, match=r"not found: .*train\.en"):
        read_parallel_files(src, tmp_path / "train.en")


def test_unequal_line_counts_name_both_files_and_the_line(tmp_path):
    src = write(tmp_path / "a.pt", ["um", "dois", "três"])
    tgt = write(tmp_path / "a.en", ["one", "two"])
    with pytest.raises(CorpusError) as err:
        read_parallel_files(src, tgt)
    message = str(err.value)
    assert str(src) in message and str(tgt) in message
    assert "3 lines" in message and "2" in message and "line 3" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = tmp_path / "bad.pt"
    src.write_bytes("linha um\nlinha dois\nlinha tr\xeas\n".encode("latin-1"))  # \xea is not UTF-8 here
    tgt = write(tmp_path / "bad.en", ["one", "two", "three"])
    with pytest.raises(CorpusError, match=rf"{src}:3: invalid UTF-8"):
        read_parallel_files(src, tgt)


@pytest.mark.parametrize("src_lines,tgt_lines", [([], []), (["", "  "], ["x", "y"])])
def test_empty_corpus_is_an_error_naming_the_files(tmp_path, src_lines, tgt_lines):
    src = write(tmp_path / "e.pt", src_lines, newline_at_end=bool(src_lines))
    tgt = write(tmp_path / "e.en", tgt_lines, newline_at_end=bool(tgt_lines))
    with pytest.raises(CorpusError, match="empty corpus") as err:
        read_parallel_files(src, tgt)
    assert str(src) in str(err.value) and str(tgt) in str(err.value)


def test_empty_pairs_are_dropped_and_counted(tmp_path):
    write(tmp_path / "train.pt", ["um", "", "três", "quatro ", "\t"])
    write(tmp_path / "train.en", ["one", "two", "  ", "four", "five"])
    corpus = load_corpus(DataConfig(data_dir=str(tmp_path)))
    assert pairs(corpus.train) == [("um", "one"), ("quatro", "four")]
    assert corpus.num_train == 2
    assert corpus.dropped_empty == 3


def test_windows_line_endings_and_bom_are_stripped(tmp_path):
    (tmp_path / "train.pt").write_bytes("\ufeffum\r\ndois\r\n".encode("utf-8"))
    (tmp_path / "train.en").write_bytes(b"one\r\ntwo")
    assert pairs(load_corpus(DataConfig(data_dir=str(tmp_path))).train) == [("um", "one"), ("dois", "two")]


def test_data_dir_layout_with_and_without_validation(tmp_path):
    write(tmp_path / "train.pt", ["a", "b", "c"])
    write(tmp_path / "train.en", ["A", "B", "C"])
    corpus = load_corpus(DataConfig(data_dir=str(tmp_path), max_train_examples=2))
    assert corpus.validation is None and corpus.num_validation is None
    assert pairs(corpus.train) == [("a", "A"), ("b", "B")]
    assert corpus.name == tmp_path.name

    write(tmp_path / "validation.pt", ["v1", "v2"])
    with pytest.raises(CorpusError, match=r"validation\.en"):  # half a validation split
        load_corpus(DataConfig(data_dir=str(tmp_path)))
    write(tmp_path / "validation.en", ["V1", "V2"])
    corpus = load_corpus(DataConfig(data_dir=str(tmp_path), max_val_examples=1))
    assert pairs(corpus.validation) == [("v1", "V1")] and corpus.num_validation == 1

    with pytest.raises(CorpusError, match="directory not found"):
        load_corpus(DataConfig(data_dir=str(tmp_path / "nope")))


def test_explicit_files_take_precedence(tmp_path):
    write(tmp_path / "train.pt", ["dir"])
    write(tmp_path / "train.en", ["DIR"])
    src = write(tmp_path / "x.pt", ["um", "dois"])
    tgt = write(tmp_path / "x.en", ["one", "two"])
    vsrc = write(tmp_path / "y.pt", ["três"])
    vtgt = write(tmp_path / "y.en", ["three"])
    corpus = load_corpus(DataConfig(data_dir=str(tmp_path), train_src=str(src), train_tgt=str(tgt),
                                    val_src=str(vsrc), val_tgt=str(vtgt)))
    assert pairs(corpus.train) == [("um", "one"), ("dois", "two")]
    assert pairs(corpus.validation) == [("três", "three")]
    with pytest.raises(CorpusError, match="--train-src and --train-tgt"):
        load_corpus(DataConfig(train_src=str(src)))
    with pytest.raises(CorpusError, match="--val-src and --val-tgt"):
        load_corpus(DataConfig(train_src=str(src), train_tgt=str(tgt), val_src=str(vsrc)))


def test_fingerprint_identifies_the_training_data(tmp_path):
    write(tmp_path / "train.pt", ["a", "b", "c"])
    write(tmp_path / "train.en", ["A", "B", "C"])
    first = load_corpus(DataConfig(data_dir=str(tmp_path))).fingerprint
    assert load_corpus(DataConfig(data_dir=str(tmp_path))).fingerprint == first
    assert load_corpus(DataConfig(data_dir=str(tmp_path), max_train_examples=2)).fingerprint != first
    write(tmp_path / "train.en", ["A", "B", "D"])
    assert load_corpus(DataConfig(data_dir=str(tmp_path))).fingerprint != first


def test_bible_corpus_loads_with_readme_counts(bible_dir):
    corpus = load_corpus(DataConfig(data_dir=str(bible_dir)))
    assert (corpus.num_train, corpus.num_validation, corpus.dropped_empty) == (29431, 783, 0)
    src, tgt = next(iter(corpus.train))
    assert src.dtype == tf.string and src.shape == () and tgt.shape == ()


def test_tfds_path_under_mock_data_yields_string_pairs():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=6):
        corpus = load_corpus(DataConfig(dataset="ted_hrlr_translate/pt_to_en", max_train_examples=4))
        examples = list(corpus.train.as_numpy_iterator())
    assert corpus.name == "ted_hrlr_translate-pt_to_en"
    assert corpus.train.element_spec == (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string))
    assert 1 <= len(examples) <= 4
    assert all(isinstance(s, bytes) and s.strip() and isinstance(t, bytes) and t.strip() for s, t in examples)
    assert len(corpus.fingerprint) == 64


def test_tfds_path_drops_pairs_with_an_empty_side():
    import tensorflow_datasets as tfds

    rows = [("um", "one"), ("", "two"), ("três", " "), ("quatro", "four")]

    def as_dataset(self, split, *args, **kwargs):
        return tf.data.Dataset.from_tensor_slices({"pt": [r[0] for r in rows], "en": [r[1] for r in rows]})

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        corpus = load_corpus(DataConfig(dataset="ted_hrlr_translate/pt_to_en"))
        assert pairs(corpus.train) == [("um", "one"), ("quatro", "four")]
        limited = load_corpus(DataConfig(dataset="ted_hrlr_translate/pt_to_en", max_train_examples=1))
        assert pairs(limited.train) == [("um", "one")]
    assert limited.fingerprint != corpus.fingerprint


def test_unknown_tfds_dataset_is_a_corpus_error():
    with pytest.raises(CorpusError, match="no_such_dataset"):
        load_corpus(DataConfig(dataset="no_such_dataset_xyz/pt_to_en"))
