"""transformer-benchmark-pipeline: times both training-batch forms, or only the one
`--training-batches` names, building the ids in memory only for the plan."""

import json

from conftest import bible_slice_argv, script_main


def _argv(bible_tokenizers, output, *extra):
    return [*bible_slice_argv(bible_tokenizers), "--max-tokens", "512", "--epochs", "1", "--output", str(output), *extra]


def test_both_forms_by_default_and_only_the_named_one_with_the_flag(bible_tokenizers, tmp_path):
    main = script_main("benchmark_pipeline")
    assert main(_argv(bible_tokenizers, tmp_path / "both.json")) == 0
    both = json.loads((tmp_path / "both.json").read_text())
    forms = {cell["form"]: cell for cell in both["epochs"]}
    assert sorted(forms) == ["plan", "stream"]
    assert forms["plan"]["batches"] == forms["stream"]["batches"] > 0  # the same batches, two ways

    for flag, form in (("planned", "plan"), ("streamed", "stream")):
        output = tmp_path / f"{flag}.json"
        assert main(_argv(bible_tokenizers, output, "--training-batches", flag)) == 0
        report = json.loads(output.read_text())
        assert [cell["form"] for cell in report["epochs"]] == [form]
        assert list(report["best_batches_per_s"]) == [form]
        assert (report["ids_build_s"] is None) == (form == "stream")  # only the plan builds ids in memory
