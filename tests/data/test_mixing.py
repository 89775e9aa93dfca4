"""Several corpora with sampling weights (`--data A --data B:0.5`): flag parsing, what an
epoch of the mixture holds, validation choice, errors naming the flag, tokenizer keys and
config.json compatibility."""

import argparse
import json
from collections import Counter
from pathlib import Path

import pytest

from transformer.base import cli
from transformer.base.config import CorpusSpec, DataConfig, PipelineConfig, RunConfig, TokenizerConfig
from transformer.data.corpora import CorpusError, load_corpus
from transformer.data.pipeline import make_batches
from transformer.data.tokenizer import tokenizer_key


def write_pair(prefix: Path, name: str, count: int) -> Path:
    """`prefix.pt` / `prefix.en` with `count` pairs whose text says which corpus they are from."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.pt").write_text("".join(f"{name} frase {i}\n" for i in range(count)), encoding="utf-8")
    Path(f"{prefix}.en").write_text("".join(f"{name} sentence {i}\n" for i in range(count)), encoding="utf-8")
    return prefix


@pytest.fixture
def three_corpora(tmp_path):
    """A directory `main/` (10 pairs + 3 validation pairs) and two file-pair prefixes."""
    write_pair(tmp_path / "main" / "train", "main", 10)
    write_pair(tmp_path / "main" / "validation", "val", 3)
    write_pair(tmp_path / "extra" / "train.b", "bbb", 20)
    write_pair(tmp_path / "extra" / "train.c", "ccc", 4)
    return tmp_path


def parse_args(argv):
    parser = argparse.ArgumentParser()
    cli.add_data_args(parser)
    return parser.parse_args(argv)


def origins(dataset) -> Counter:
    return Counter(src.decode().split()[0] for src, _ in dataset.as_numpy_iterator())


def test_flags_repeated_and_comma_separated_with_weights(tmp_path):
    config = cli.run_config_from_args(parse_args(["--data", "corpus/a", "--data", "x/train.b:0.5,x/train.c:2"]))
    assert config.data.corpora == (CorpusSpec("corpus/a"), CorpusSpec("x/train.b", 0.5), CorpusSpec("x/train.c", 2.0))
    assert [str(spec) for spec in config.data.corpora] == ["corpus/a", "x/train.b:0.5", "x/train.c:2"]
    colon = tmp_path / "with:colon"
    colon.mkdir()
    assert cli.parse_data_arg(str(colon)) == (CorpusSpec(str(colon)),)  # an existing path keeps its colon


@pytest.mark.parametrize("value,needle", [("a/b:zero", "'zero'"), ("a/b:0", "positive"), ("a/b:-1", "positive"),
                                          ("a/b:inf", "positive"), ("a,,b", "empty")])
def test_bad_weight_is_an_argparse_error_naming_the_flag_as_typed(value, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--data", value])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert "argument --data" in message and repr(value) in message and needle in message


def test_one_epoch_holds_each_corpus_weight_times_its_size(three_corpora):
    corpus = load_corpus(DataConfig(corpora=(CorpusSpec(str(three_corpora / "main")),
                                             CorpusSpec(str(three_corpora / "extra" / "train.b"), 0.5),
                                             CorpusSpec(str(three_corpora / "extra" / "train.c"), 2.5))))
    assert corpus.num_train == 10 + 10 + 10 == corpus.mixture.epoch_size
    assert origins(corpus.train) == {"main": 10, "bbb": 10, "ccc": 10}
    assert origins(corpus.train) == origins(corpus.train)  # the tokenizers' epoch is fixed
    assert corpus.name == "main+train.b+train.c"

    epoch = corpus.mixture.epoch(seed=3)  # the training draw: a fresh subset of `bbb` each epoch
    draws = [sorted(src.decode() for src, _ in epoch.as_numpy_iterator() if src.startswith(b"bbb"))
             for _ in range(4)]
    assert all(len(draw) == 10 and len(set(draw)) == 10 for draw in draws)
    assert len({tuple(draw) for draw in draws}) > 1
    assert len({s for draw in draws for s in draw}) > 10  # over epochs more than one half of `bbb` is seen
    ccc = Counter(src.decode() for src, _ in epoch.as_numpy_iterator() if src.startswith(b"ccc"))
    assert sum(ccc.values()) == 10 and set(ccc.values()) <= {2, 3}  # 4 pairs, 2.5 times each


def test_parts_are_interleaved_in_proportion(tmp_path):
    write_pair(tmp_path / "a", "aaa", 300)
    write_pair(tmp_path / "b", "bbb", 300)
    corpus = load_corpus(DataConfig(corpora=(CorpusSpec(str(tmp_path / "a")), CorpusSpec(str(tmp_path / "b"), 1 / 3))))
    sequence = [src.decode()[:3] for src, _ in corpus.mixture.epoch(seed=0).as_numpy_iterator()]
    assert Counter(sequence) == {"aaa": 300, "bbb": 100}
    first_half = Counter(sequence[:200])
    assert 35 <= first_half["bbb"] <= 65  # 50 expected: mixed throughout, not one corpus after the other


def test_optimized_pipeline_draws_the_mixture(three_corpora, bible_tokenizers):
    corpus = load_corpus(DataConfig(corpora=(CorpusSpec(str(three_corpora / "main")),
                                             CorpusSpec(str(three_corpora / "extra" / "train.b"), 0.5))))
    config = PipelineConfig(max_tokens=64, bucket_width=8)
    batches = make_batches(corpus.training_pairs, bible_tokenizers.tokenizers, config, max_length=16,
                           training=False, seed=0)
    sentences = sum(int(src.shape[0]) for (src, _), _ in batches)
    assert sentences == corpus.num_train == 20
    naive = make_batches(corpus.training_pairs, bible_tokenizers.tokenizers, PipelineConfig(kind="naive", batch_size=7),
                         max_length=16, training=True, seed=0)
    assert sum(int(src.shape[0]) for (src, _), _ in naive) == 20


def test_validation_comes_from_the_first_directory_that_has_one(three_corpora):
    prefix, main = str(three_corpora / "extra" / "train.b"), str(three_corpora / "main")
    corpus = load_corpus(DataConfig(corpora=(CorpusSpec(prefix), CorpusSpec(main))))
    assert corpus.num_validation == 3 and origins(corpus.validation) == {"val": 3}
    assert load_corpus(DataConfig(corpora=(CorpusSpec(prefix),))).validation is None


def test_missing_pair_file_names_the_flag_as_typed(three_corpora):
    typed = f"{three_corpora}/extra/train.nope:0.5"
    with pytest.raises(CorpusError, match=rf"--data {typed}: .*train\.nope\.pt"):
        load_corpus(DataConfig(corpora=cli.parse_data_arg(typed)))
    (three_corpora / "extra" / "train.b.en").unlink()  # half a pair
    typed = f"{three_corpora}/extra/train.b:2"
    with pytest.raises(CorpusError, match=rf"--data {typed}: corpus file not found: .*train\.b\.en"):
        load_corpus(DataConfig(corpora=cli.parse_data_arg(typed)))


def test_tokenizer_key_covers_every_input_and_weight(three_corpora):
    main, b = str(three_corpora / "main"), str(three_corpora / "extra" / "train.b")
    config = TokenizerConfig(vocab_size=100)

    def key(*specs):
        return tokenizer_key(load_corpus(DataConfig(corpora=specs)), config)

    base = key(CorpusSpec(main), CorpusSpec(b, 0.5))
    assert key(CorpusSpec(main), CorpusSpec(b, 0.5)) == base
    assert key(CorpusSpec(main)) == tokenizer_key(load_corpus(DataConfig(data_dir=main)), config)  # as before
    others = [key(CorpusSpec(main)), key(CorpusSpec(main), CorpusSpec(b, 0.25)), key(CorpusSpec(main), CorpusSpec(b))]
    write_pair(three_corpora / "extra" / "train.b", "bbx", 20)  # the extra corpus changes
    others.append(key(CorpusSpec(main), CorpusSpec(b, 0.5)))
    assert len({base, *others}) == 1 + len(others)


def test_corpora_round_trip_and_old_config_files_load(tmp_path):
    config = RunConfig().replace(data={"corpora": (CorpusSpec("d"), CorpusSpec("e/train.x", 0.5))})
    config.save(tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text())["data"]["corpora"] == [
        {"path": "d", "weight": 1.0}, {"path": "e/train.x", "weight": 0.5}]
    assert RunConfig.load(tmp_path / "config.json") == config
    old = RunConfig().to_dict()
    del old["data"]["corpora"]  # a config.json written before corpora existed
    old["data"]["data_dir"] = "/data/bible"
    loaded = RunConfig.from_dict(old)
    assert loaded.data.local_corpora == (CorpusSpec("/data/bible"),)
    with pytest.raises(TypeError, match=r"data\.corpora\[0\]\.weight"):
        RunConfig.from_dict({"data": {"corpora": [{"path": "d", "weight": "half"}]}})
    with pytest.raises(TypeError, match=r"data\.corpora"):
        RunConfig.from_dict({"data": {"corpora": "d"}})
    with pytest.raises(ValueError, match="data_dir and data.corpora"):
        RunConfig().replace(data={"data_dir": "d", "corpora": (CorpusSpec("e"),)}).validate()


def test_train_on_a_mixture_end_to_end(three_corpora, bible_tokenizers):
    import dataclasses
    import shutil

    from transformer.base.config import ModelConfig, TrainConfig
    from transformer.training.trainer import train

    output = three_corpora / "run"
    data = DataConfig(corpora=cli.parse_data_arg(f"{three_corpora}/extra/train.b:0.5,{three_corpora}/main"))
    tokenizer = dataclasses.replace(bible_tokenizers.config, root=str(three_corpora / "tokenizers"))
    key = tokenizer_key(load_corpus(data), tokenizer)  # the session's vocabulary stands in: no learning here
    shutil.copytree(bible_tokenizers.directory, three_corpora / "tokenizers" / key)
    config = RunConfig(
        data=data,
        tokenizer=tokenizer,
        model=ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, max_length=16),
        pipeline=PipelineConfig(max_tokens=64),
        train=TrainConfig(epochs=2, probe_peak=False, verbose=0, bleu_sentences=0, lr_schedule="inverse-sqrt",
                          output_dir=str(output)),
    )
    result = train(config)
    assert RunConfig.load(output / "config.json").data == config.data
    assert result.summary["epochs_run"] == 2 and result.summary["val_loss"] is not None  # validation from main/
    report = json.loads((output / "report.json").read_text())
    assert report["run"]["dataset"] == f"{three_corpora}/extra/train.b:0.5 {three_corpora}/main"
    assert report["steps_done"] == result.summary["optimizer_steps"] > 0
