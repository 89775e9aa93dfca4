"""What subword sampling costs the input pipeline: one epoch of training batches with the
deterministic, cached segmentation against one with freshly sampled segmentations.

    python scripts/benchmark_subword.py --data ../shared/data/bible-pt-en \
        --data ../shared/data/bible-pt-en/extra/train.blivre_nheb --tokenizer sentencepiece \
        --subword-alpha 0.1 --rounds 2 --output runs/benchmark-subword.json

Builds (or reuses) the tokenizers, then per round and variant reads two full passes of the
training pipeline (`pipeline.make_batches`, the default 2,048-token batches) and times the
second: the steady state of a run's later epochs (the first pass of the deterministic variant
also fills its id cache). Variants alternate within each round. Reports wall seconds, process
CPU seconds (all threads) and batches / real target tokens per pass to JSON and stdout; the
CPU seconds are what the pipeline takes from the cores a training step would use.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

from transformer.base import atomic, cli
from transformer.base.errors import ConfigError, command


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_data_args(parser)
    cli.add_tokenizer_args(parser)
    cli.add_pipeline_args(parser)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both variants (default %(default)s)")
    parser.add_argument("--output", type=Path, help="JSON report")
    args = parser.parse_args(argv)
    cli.start()
    config = cli.run_config_from_args(args)
    if not config.pipeline.sampling:
        raise ConfigError("--subword-alpha: give the sampling to compare (e.g. --tokenizer sentencepiece "
                          "--subword-alpha 0.1)")
    from transformer.data.corpora import load_corpus
    from transformer.data.pipeline import make_batches
    from transformer.data.tokenizer import build_or_load_tokenizers
    from transformer.measure.environment import capture_environment
    from transformer.measure.input_pass import time_pass

    corpus = load_corpus(config.data)
    tokenizers, directory = build_or_load_tokenizers(corpus, config.tokenizer)
    pipeline = config.pipeline if isinstance(config.pipeline.max_tokens, int) else dataclasses.replace(
        config.pipeline, max_tokens=2048)
    variants = {"deterministic": dataclasses.replace(pipeline, subword_alpha=0.0), "sampled": pipeline}
    results = {name: [] for name in variants}
    for round_index in range(args.rounds):
        for name, variant in variants.items():
            batches = make_batches(corpus.training_pairs, tokenizers, variant, args.max_length, training=True,
                                   seed=round_index)
            time_pass(batches)  # the first pass (deterministic: fills the id cache)
            second = time_pass(batches)
            results[name].append(second)
            print(f"round {round_index + 1} {name:13s} second pass: {second['wall_s']:.1f} s wall, "
                  f"{second['cpu_s']:.1f} s CPU, {second['batches']} batches, {second['target_tokens']:,} "
                  "target tokens", flush=True)
    report = dict(command=" ".join(sys.argv), tokenizers=str(directory), pairs_per_epoch=corpus.num_train,
                  sampling=dict(nbest=pipeline.subword_nbest, alpha=pipeline.subword_alpha),
                  max_tokens=pipeline.max_tokens, environment=capture_environment(), passes=results)
    if args.output:
        atomic.write_json(args.output, report, default=str)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
