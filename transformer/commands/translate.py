"""Translate Portuguese sentences with a training run or an export (SavedModel or CTranslate2).

    python scripts/translate.py --model runs/bible "No princípio, Deus criou os céus e a terra."
    echo "Deus é amor." | python scripts/translate.py --model exports/bible
    python scripts/translate.py --model runs/bible --file sentences.pt --beam 4 > out.en
    python scripts/translate.py --model exports/bible --file big.pt --output big.en   # progress bar
    python scripts/translate.py --model runs/bible "Deus é amor." --plot-attention attention.png
    python scripts/translate.py --model exports/bible-ct2 --compute-type int8 --file big.pt --output big.en

--model is a run directory (config.json + checkpoints/), an export (saved_model.pb) or a
CTranslate2 export (model.bin: export.py --format ctranslate2, decoded by CTranslate2 in
--compute-type); decoding flags (--beam, --xla, …) apply to run directories, an export decodes
as exported.
Sentences come from the arguments, else --file, else stdin (one per line). One translation
per input line is printed (or written to --output), in order. --file and stdin are streamed in
blocks of --block-lines (each sorted by length and decoded in chunks), so a file of any size
fits in memory; --output is written atomically (it appears complete or not at all). A progress
bar with sentences/s and the time left goes to stderr (with --output or on a terminal).
"""

import argparse
import contextlib
import sys
from pathlib import Path

from transformer.base import atomic, cli
from transformer.base.errors import ConfigError, MissingFileError, command
from transformer.runtime.onednn import configure_onednn


def open_input(args, stack: contextlib.ExitStack):
    """(lines, total or None): the arguments, --file (streamed) or stdin (streamed)."""
    from transformer.inference.streaming import count_lines, read_lines

    if args.sentences:
        return iter(args.sentences), len(args.sentences)
    if args.file:
        path = Path(args.file)
        if path.is_dir() or not path.is_file():
            raise MissingFileError(f"--file {args.file}: {'is a directory' if path.is_dir() else 'file not found'}",
                                   hint="give a text file, one sentence per line")
        return read_lines(stack.enter_context(open(path, "rb"))), count_lines(path)
    return read_lines(sys.stdin.buffer), None


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: --file or stdin)")
    parser.add_argument("--model", required=True, help="run directory, SavedModel export or CTranslate2 export")
    cli.add_checkpoint_arg(parser)
    parser.add_argument("--file", help="read sentences from this file, one per line (streamed: any size)")
    parser.add_argument("--output", metavar="OUT", help="write the translations to this file (atomically) instead of stdout")
    parser.add_argument("--block-lines", type=int, default=1024,
                        help="lines translated per call when streaming (default 1024; sorted by length inside)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: with --output, or when stderr is a terminal)")
    parser.add_argument("--plot-attention", metavar="PNG",
                        help="draw the cross-attention heatmap of the first sentence to this file")
    parser.add_argument("--head", type=int, help="plot one attention head (default: mean over heads)")
    cli.add_decode_args(parser)
    cli.add_thread_args(parser)
    cli.add_compute_type_arg(parser)
    args = parser.parse_args(argv)
    if args.block_lines <= 0:
        raise ConfigError(f"--block-lines must be > 0, got {args.block_lines}")
    cli.check_thread_args(args)
    config = cli.decode_config_from_args(args)
    cli.start()
    configure_onednn(args.onednn, cli.model_dtype(args.model))  # before TensorFlow loads

    from tqdm import tqdm

    from transformer.inference.export import configure_decoding_threads, open_translator
    from transformer.inference.streaming import translate_blocks

    configure_decoding_threads(args.model, config, intra_op=args.intra_op_threads, inter_op=args.inter_op_threads)

    with contextlib.ExitStack() as stack:
        lines, total = open_input(args, stack)
        translator = open_translator(args.model, config, args.checkpoint, args.compute_type)
        if args.plot_attention and not hasattr(translator, "attention"):
            raise ConfigError(f"--plot-attention: {args.model} is a CTranslate2 export, which returns no attention "
                              "weights", hint="plot from the run directory or its SavedModel export")
        out = stack.enter_context(atomic.open_text(args.output)) if args.output else sys.stdout
        show = args.progress if args.progress is not None else bool(args.output) or sys.stderr.isatty()
        bar = stack.enter_context(tqdm(total=total, unit=" sentences", unit_scale=True, file=sys.stderr,
                                       disable=not show, desc="translating", mininterval=0.5))
        first, written = [], 0

        def remember(lines):
            for line in lines:
                if not first:
                    first.append(line)
                yield line

        for translations in translate_blocks(translator.translate, remember(lines), args.block_lines):
            out.write("".join(f"{t}\n" for t in translations))
            out.flush()
            bar.update(len(translations))
            written += len(translations)  # not bar.n: a disabled bar counts nothing
    if args.output:
        print(f"{written} translations: {args.output}", file=sys.stderr)
    if args.plot_attention and first:
        from transformer.measure.attention_plot import attention_for_sentence, plot_attention

        weights, source, target, translation = attention_for_sentence(translator.attention(first), 0, args.head)
        path = plot_attention(weights, source, target, args.plot_attention,
                              title=f"{first[0]}\n→ {translation}")
        print(f"attention heatmap: {path}", file=sys.stderr)
    return 0



if __name__ == "__main__":
    sys.exit(main())
