"""How fast the training input pipeline makes batches, without a model: streamed and planned.

    python scripts/benchmark_pipeline.py --data ../shared/data/bible-pt-en \
        --data ../shared/data/bible-pt-en/extra/train.blivre_nheb --max-tokens 16384 --output runs/pipeline.json

Loads the corpus and tokenizers as scripts/train.py does (same data, tokenizer and pipeline
flags; the tokenizer cache is used), then times `--epochs` whole epochs of training batches of
each form, alternating: "stream" (tf.data cache, mixture sampling, shuffle buffer,
`bucket_by_sequence_length`: transformer/data/pipeline.py) and "plan" (a whole epoch planned
with vectorized ops: transformer/data/epoch_plan.py, what training uses for ids in memory);
`--training-batches streamed|planned` times only the form it names (streamed alone builds no
ids in memory: the report's `ids_build_s` and `pairs` are then null).
Per epoch: batches/s, pairs/s, the wait for its first batch, and the padding of target
batches. A train step of S seconds needs 1/S batches/s: an H100 XLA step of 16,384 tokens
(~16 ms) needs ~64. Defaults: 16,384 tokens, the geometric grid (what XLA runs get).
"""

import argparse
import sys
import time
from pathlib import Path

from transformer.base import atomic, cli
from transformer.base.errors import command

FORMS = ("stream", "plan")
FORM_OF_FLAG = {"streamed": "stream", "planned": "plan"}  # --training-batches -> the form it names


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_data_args(parser)
    cli.add_tokenizer_args(parser)
    cli.add_pipeline_args(parser)
    parser.set_defaults(max_tokens=16384, length_buckets="geometric")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs of each form (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="JSON report")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be >= 1")
    if args.max_tokens in ("auto", 0):
        parser.error("--max-tokens: give a number of tokens per batch (auto is decided by a training probe)")
    cli.start()
    config = cli.run_config_from_args(args)

    import keras

    from transformer.data.corpora import load_corpus
    from transformer.data.pipeline import make_batches, pair_ids
    from transformer.data.tokenizer import build_or_load_tokenizers
    from transformer.measure.environment import capture_environment
    from transformer.measure.input_pass import time_pass

    keras.utils.set_random_seed(args.seed)
    corpus = load_corpus(config.data)
    tokenizers, _ = build_or_load_tokenizers(corpus, config.tokenizer)
    pairs, max_length = corpus.training_pairs, config.model.max_length
    forms = (FORM_OF_FLAG[args.training_batches],) if args.training_batches else FORMS
    ids = ids_s = None  # the ids in memory: only the plan reads them
    if "plan" in forms:
        started = time.perf_counter()
        ids = pair_ids(pairs, tokenizers, max_length)
        ids_s = time.perf_counter() - started
    datasets = {form: make_batches(pairs, tokenizers, config.pipeline, max_length, training=True, seed=args.seed,
                                   tokenized=ids if form == "plan" else None)  # None: the stream, cached
                for form in forms}
    epochs = []
    for epoch in range(args.epochs):
        for form in forms:
            timed = time_pass(datasets[form])
            seconds, padded = timed["wall_s"], timed["target_padded"]
            cell = dict(form=form, epoch=epoch, batches=timed["batches"], pairs=timed["rows"], seconds=seconds,
                        cpu_s=timed["cpu_s"], first_batch_s=timed["first_batch_s"],
                        batches_per_s=timed["batches"] / seconds, pairs_per_s=timed["rows"] / seconds,
                        tgt_padding=1 - timed["target_tokens"] / padded if padded else 0.0)
            epochs.append(cell)
            print(f"epoch {epoch} {form}: {cell['batches']} batches, {cell['pairs']:,} pairs in {seconds:.2f} s: "
                  f"{cell['batches_per_s']:,.1f} batches/s, {cell['pairs_per_s']:,.0f} pairs/s, first batch "
                  f"{cell['first_batch_s'] or 0:.2f} s, target padding {cell['tgt_padding']:.1%}", flush=True)
    best = {form: max(c["batches_per_s"] for c in epochs if c["form"] == form) for form in forms}
    if ids is not None:
        print(f"\nids in memory built in {ids_s:.1f} s ({sum(ids.sizes):,} pairs)")
    print("\n| form | best batches/s | best pairs/s |\n|---|---|---|")
    for form in forms:
        pairs_s = max(c["pairs_per_s"] for c in epochs if c["form"] == form)
        print(f"| {form} | {best[form]:,.1f} | {pairs_s:,.0f} |")
    if len(forms) == 2:
        print(f"plan ÷ stream: {best['plan'] / best['stream']:.1f}×")
    if args.output:
        report = dict(command=" ".join(sys.argv), pipeline=config.pipeline.__dict__, ids_build_s=ids_s,
                      pairs=sum(ids.sizes) if ids is not None else None, epochs=epochs, best_batches_per_s=best,
                      environment=capture_environment())
        atomic.write_json(args.output, report, default=str)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
