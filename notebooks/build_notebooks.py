"""Writes the Colab notebooks from the cells below (the reviewable source of the .ipynb files).

    python notebooks/build_notebooks.py          # rewrite notebooks/*.ipynb
    python notebooks/build_notebooks.py --check  # exit 1 if a committed notebook differs

The notebooks are thin callers of the `transformer` package: cells configure, call and
display; no library code lives in them. Each notebook starts with one cell tagged
`parameters` (papermill's convention) that holds every size knob, so a test can shrink
them (tests/test_notebooks.py inserts an `injected-parameters` cell right after it). They
are written without outputs and with stable cell ids, so regenerating gives no diff.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
PARAMETERS_TAG = "parameters"
REPO_PLACEHOLDER = "https://github.com/<org>/<repo>.git"


def _src(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


# ----------------------------------------------------------------------------- shared cells

REPO_PARAMETERS = _src(f'''
    # Colab only: where the code comes from (replace with this repository's public URL).
    REPO_URL = "{REPO_PLACEHOLDER}"
    REPO_REF = "main"                 # branch or tag to clone
    COLAB_REPO_DIR = "/content/nmt"   # where the clone goes on Colab
''')

DATA_PARAMETERS = _src('''
    # Data. "auto": the TFDS TED talks corpus on Colab (downloaded there); elsewhere the
    # offline Bible corpus at <repo>/../shared/data/bible-pt-en when present, else TFDS.
    # Or a directory with train.pt/train.en/validation.pt/validation.en, or None for TFDS.
    DATA_DIR = "auto"
    DATASET = "ted_hrlr_translate/pt_to_en"   # the TFDS dataset used when DATA_DIR is None
''')


def _output_parameters(output_root_line: str) -> str:
    """The outputs block of a parameters cell (only OUTPUT_ROOT differs between notebooks)."""
    return output_root_line + "\n" + _src('''
        # A relative OUTPUT_ROOT is inside the repository clone, or inside MyDrive with
        # SAVE_TO_DRIVE (Colab: mounts Google Drive, so results survive the runtime).
        SAVE_TO_DRIVE = False
        # Tokenizers are built once per corpus + vocabulary size and reused from here;
        # None: OUTPUT_ROOT/tokenizers; a relative path is inside the clone (e.g. "tokenizers",
        # shared with scripts/train.py).
        TOKENIZER_ROOT = None
    ''')


SETUP_MARKDOWN = _src('''
    ## Setup

    On Colab this clones the repository into `COLAB_REPO_DIR` and installs its pinned
    `requirements.txt` (TensorFlow and tensorflow-text on the same minor version; on a GPU
    runtime also `tensorflow[and-cuda]`, the CUDA libraries this TensorFlow build expects).
    If pip had to upgrade a package this session had already imported, the cell stops and
    asks for **Runtime → Restart session**, then **Run all** again (the second time the
    setup finds everything in place). Outside Colab it uses the clone this notebook lives in
    and installs nothing: create the environment first (`pip install -r requirements.txt`).
''')

SETUP_CELL = _src('''
    import importlib.metadata
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    IN_COLAB = "google.colab" in sys.modules


    def pip_install(*args):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True)


    if IN_COLAB:
        REPO_DIR = Path(COLAB_REPO_DIR)
        if not (REPO_DIR / "transformer").is_dir():
            if "<org>" in REPO_URL:
                raise ValueError("set REPO_URL in the parameters cell to this repository's git URL")
            subprocess.run(["git", "clone", "--depth", "1", "--branch", REPO_REF, REPO_URL, str(REPO_DIR)],
                           check=True)
        requirements = REPO_DIR / "requirements.txt"
        pip_install("-r", str(requirements))
        if shutil.which("nvidia-smi"):  # GPU runtime: TensorFlow's CUDA libraries, same version pin
            pin = next(line.split("#")[0].strip() for line in requirements.read_text().splitlines()
                       if line.startswith("tensorflow=="))
            pip_install(pin.replace("tensorflow==", "tensorflow[and-cuda]=="))
        stale = [name for name in ("numpy", "tensorflow", "keras", "matplotlib")
                 if name in sys.modules
                 and getattr(sys.modules[name], "__version__", None) != importlib.metadata.version(name)]
        if stale:
            raise RuntimeError(f"pip upgraded {stale}, already imported by this session: "
                               "Runtime → Restart session, then Runtime → Run all")
    else:  # a local clone: notebooks/ is inside it; nothing is installed
        REPO_DIR = next((p for p in (Path.cwd(), *Path.cwd().parents)
                         if (p / "transformer" / "__init__.py").is_file()), None)
        if REPO_DIR is None:
            raise FileNotFoundError(f"no repository clone above {Path.cwd()}: start Jupyter inside the clone")

    if str(REPO_DIR) not in sys.path:
        sys.path.insert(0, str(REPO_DIR))

    from transformer import cli
    from transformer.versions import check_versions

    cli.quiet_tensorflow()  # before TensorFlow is imported
    TF_VERSION, TEXT_VERSION = check_versions()  # TensorFlow and tensorflow-text on one minor version

    if DATA_DIR == "auto":
        bible = REPO_DIR.parent / "shared" / "data" / "bible-pt-en"
        DATA_DIR = str(bible) if not IN_COLAB and bible.is_dir() else None

    if SAVE_TO_DRIVE and IN_COLAB:
        from google.colab import drive

        drive.mount("/content/drive")
        OUTPUT_ROOT = Path("/content/drive/MyDrive") / OUTPUT_ROOT
    OUTPUT_ROOT = (REPO_DIR / OUTPUT_ROOT).resolve()  # an absolute OUTPUT_ROOT stays as it is
    OUTPUT_ROOT.mkdir(parents=True, exist_ok=True)
    TOKENIZER_ROOT = (REPO_DIR / TOKENIZER_ROOT).resolve() if TOKENIZER_ROOT else OUTPUT_ROOT / "tokenizers"

    print(f"repository:   {REPO_DIR}  (Colab: {IN_COLAB})")
    print(f"versions:     tensorflow {TF_VERSION}, tensorflow-text {TEXT_VERSION}")
    print(f"data:         {DATA_DIR or 'TFDS ' + DATASET}")
    print(f"outputs:      {OUTPUT_ROOT}")
    print(f"tokenizers:   {TOKENIZER_ROOT}")
''')


def _config_cell(train_fields: str, pipeline_fields: str) -> str:
    """The RunConfig built from the parameters (the same typed config as scripts/train.py)."""
    return _src(f'''
        import json

        from transformer.config import DataConfig, ModelConfig, PipelineConfig, RunConfig, TokenizerConfig, TrainConfig

        BASE_CONFIG = RunConfig(
            data=DataConfig(data_dir=DATA_DIR, dataset=DATASET, max_train_examples=MAX_TRAIN_EXAMPLES,
                            max_val_examples=MAX_VAL_EXAMPLES),
            tokenizer=TokenizerConfig(vocab_size=VOCAB_SIZE, root=str(TOKENIZER_ROOT)),  # shared by the runs
            model=ModelConfig(num_layers=NUM_LAYERS, d_model=D_MODEL, num_heads=NUM_HEADS, dff=DFF,
                              head_width="tutorial", max_length=MAX_LENGTH),
            pipeline=PipelineConfig({pipeline_fields}),
            train=TrainConfig({train_fields}),
        ).validate()
        print(json.dumps(BASE_CONFIG.to_dict(), indent=1))
    ''')


# ----------------------------------------------------------------------------- notebook 01

NB01_INTRO = _src('''
    # Training speed: CPU vs GPU, precision, XLA and the input pipeline

    This notebook trains the pt→en Transformer for a few steps under different settings and
    compares their **step-time reports**: each `transformer.training.train()` run writes
    `report.json` (environment, settings, steady-state step time, tokens/s, time spent
    waiting for data) plus a per-step CSV, and `transformer.compare` turns two or more
    reports into a table and a plot.

    1. **Setup**: clone + pinned install on Colab; nothing to install locally.
    2. **Device diagnostics**: what TensorFlow sees, `nvidia-smi`, versions, which
       precisions this hardware runs fast.
    3. **Short trainings**: one per entry of `RUNS` (pipeline × precision × XLA), same data,
       model and number of steps.
    4. **Comparison**: table + step-time plot, speed-ups relative to the first report.

    Pick the runtime first (**Runtime → Change runtime type**: CPU or T4 GPU). Comparing CPU
    with GPU takes one run of this notebook per runtime type; see the last section.
    All size knobs are in the next cell.
''')

NB01_PARAMETERS = "\n\n".join([
    REPO_PARAMETERS,
    DATA_PARAMETERS,
    _src('''
        MAX_TRAIN_EXAMPLES = 20000   # first N training pairs (None: all); also what the tokenizers learn from
        MAX_VAL_EXAMPLES = 200
        VOCAB_SIZE = 8000            # WordPiece vocabulary per language

        # Model size (the TF tutorial's: 4 layers, d_model 128, 8 heads, dff 512).
        NUM_LAYERS = 4
        D_MODEL = 128
        NUM_HEADS = 8
        DFF = 512
        MAX_LENGTH = 128             # tokens per sentence, [START]/[END] included

        # Each run trains STEPS steps (one epoch limited by steps_per_epoch); the first step
        # (tracing / XLA compilation) is reported apart from the steady state.
        STEPS = 100
        VALIDATION_STEPS = 5
        BATCH_SIZE = 64              # sentences per batch, naive pipeline (the tutorial's)
        MAX_TOKENS = 8192            # padded tokens per batch per side, optimized pipeline

        # One training per entry: (pipeline, precision, xla). The first one is the baseline
        # of the speed-ups. pipeline: "naive" (the tutorial's) or "optimized" (tokenize once,
        # cache, bucket by length); precision: "off" (float32), "float16", "bfloat16" or
        # "auto" (float16 on a GPU, float32 on a CPU); xla: jit-compile the train step.
        RUNS = [
            ("naive", "off", False),
            ("optimized", "off", False),
            ("optimized", "auto", True),
        ]
    '''),
    _output_parameters('OUTPUT_ROOT = "runs/notebook01"   # one sub-directory per run, plus comparison.md / .png'),
])

NB01_DIAGNOSTICS_MARKDOWN = _src('''
    ## Device diagnostics

    What TensorFlow sees (no GPU listed on a GPU runtime usually means a CUDA/driver
    mismatch: the setup cell installs `tensorflow[and-cuda]` for that), the GPU as
    `nvidia-smi` reports it, the versions every report records, and which reduced precisions
    run fast here: float16 needs tensor cores (compute capability ≥ 7.0, e.g. T4/V100),
    bfloat16 needs ≥ 8.0 on a GPU (A100, L4) or AMX/AVX512-BF16 on a CPU.
''')

NB01_DIAGNOSTICS = _src('''
    import tensorflow as tf

    from transformer.devices import visible_devices_report
    from transformer.reports import capture_environment

    ENVIRONMENT = capture_environment()
    print("TensorFlow sees:\\n" + visible_devices_report())
    print("\\nversions: " + ", ".join(f"{name} {ENVIRONMENT[name]}"
                                     for name in ("python", "tensorflow", "tensorflow_text", "keras", "numpy")))
    print(f"CPU: {ENVIRONMENT['cpu_model']} ({ENVIRONMENT['cpu_count_usable']} usable cores)")
    print("\\n" + (ENVIRONMENT["nvidia_smi"] or "nvidia-smi: not present (no NVIDIA GPU on this runtime)"))

    GPUS = tf.config.list_physical_devices("GPU")
    if GPUS:
        capability = tf.config.experimental.get_device_details(GPUS[0]).get("compute_capability", (0, 0))
        print(f"GPU compute capability {capability}: float16 {'fast' if capability >= (7, 0) else 'slow'}, "
              f"bfloat16 {'fast' if capability >= (8, 0) else 'slow (emulated)'}")
    else:
        cpu_flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("flags")), "") if Path("/proc/cpuinfo").exists() else ""
        native_bf16 = any(flag in cpu_flags.split() for flag in ("amx_bf16", "avx512_bf16"))
        print(f"CPU only: float16 is slow here; bfloat16 {'has native support' if native_bf16 else 'is emulated (slow)'}")

    DEVICE = "gpu" if GPUS else "cpu"
    # Run directories are named after the hardware, so runs from different runtimes can share OUTPUT_ROOT.
    DEVICE_SLUG = "cpu" if not GPUS else "-".join(ENVIRONMENT["device"].lower().split())
    print(f"\\nruns on this runtime will be named {DEVICE_SLUG}-…")
''')

NB01_CONFIG_MARKDOWN = _src('''
    ## Short trainings

    The configuration every run shares (the same typed `RunConfig` that `scripts/train.py`
    builds from its flags; it is saved as `config.json` in each run directory):
''')

NB01_TRAIN_MARKDOWN = _src('''
    One `train()` per entry of `RUNS`. Each run directory holds `report.json` +
    `report_steps.csv` (the step-time report, written even if the run crashes),
    `summary.json`, `config.json`, checkpoints and TensorBoard logs. Running this cell again
    replaces this runtime's runs.

    In one Python process the runs share TensorFlow's device setup; each `train()` sets the
    Keras precision policy for itself, and the policy is set back to float32 afterwards.
''')

NB01_TRAIN = _src('''
    import keras

    from transformer.training import train

    PRECISION_AUTO = "float16" if DEVICE == "gpu" else "off"
    REPORTS = []
    for pipeline, precision, xla in RUNS:
        precision = PRECISION_AUTO if precision == "auto" else precision
        label = f"{DEVICE_SLUG}-{pipeline}-{'fp32' if precision == 'off' else precision}-{'xla' if xla else 'noxla'}"
        run_dir = OUTPUT_ROOT / label
        if run_dir.exists():
            shutil.rmtree(run_dir)  # this runtime's previous run with the same settings
        config = BASE_CONFIG.replace(
            pipeline={"kind": pipeline},
            train={"mixed_precision": precision, "xla": xla, "output_dir": str(run_dir), "label": label},
        ).validate()
        print(f"\\n=== {label} ===")
        result = train(config)
        step_time = result.summary["step_time"]
        print(label, {key: step_time[key] for key in ("first_step_s", "mean_step_s", "tgt_tokens_per_s", "data_wait_pct")})
        REPORTS.append(run_dir / "report.json")

    keras.mixed_precision.set_global_policy("float32")
''')

NB01_COMPARE_MARKDOWN = _src('''
    ## Comparison

    Every `report.json` under `OUTPUT_ROOT` (this runtime's runs, plus runs from other
    runtimes when `OUTPUT_ROOT` is on Drive), CPU runs first: the first row is the baseline of
    the speed-ups. Steady-state figures only (the first step, with tracing and XLA
    compilation, is excluded). With few `STEPS` the numbers are noisy: the point is the
    method, raise `STEPS` for figures worth quoting.
''')

NB01_COMPARE = _src('''
    from IPython.display import Image, Markdown, display

    from transformer.compare import compare

    report_paths = sorted(OUTPUT_ROOT.glob("*/report.json"),
                          key=lambda path: (not path.parent.name.startswith("cpu-"), path.stat().st_mtime))
    table = compare(report_paths, plot=OUTPUT_ROOT / "comparison.png", markdown=OUTPUT_ROOT / "comparison.md")
    display(Markdown(table))
    display(Image(filename=str(OUTPUT_ROOT / "comparison.png")))
    print(f"saved {OUTPUT_ROOT / 'comparison.md'} and {OUTPUT_ROOT / 'comparison.png'}")
''')

NB01_CPU_VS_GPU = _src('''
    ## CPU vs GPU, honestly

    TensorFlow picks its devices once per process: hiding the GPU (`--device cpu`) only works
    before the first TensorFlow operation, so one notebook session cannot train on the CPU
    and then on the GPU. Two ways to get the comparison:

    * **On Colab**: set `SAVE_TO_DRIVE = True`, run all on a **CPU** runtime, switch to a
      **T4 GPU** runtime (Runtime → Change runtime type) and run all again. Both runtimes
      write to the same `OUTPUT_ROOT` on Drive (run directories are named after the
      hardware), so the second comparison shows the CPU and T4 runs side by side with the
      CPU baseline first. Keep every other parameter the same between the two sessions.
    * **From a terminal** on a GPU machine: `scripts/benchmark.py` runs every cell of a
      pipeline × precision × XLA matrix in its own process, so `--device cpu` and
      `--device gpu` both work on one machine:

      ```bash
      python scripts/benchmark.py --device cpu --steps 100 --output runs/bench-cpu
      python scripts/benchmark.py --device gpu --steps 100 --precisions off float16 --xla off on --output runs/bench-gpu
      python scripts/compare_reports.py runs/bench-cpu/*/report.json runs/bench-gpu/*/report.json --plot cpu_vs_gpu.png
      ```

    What to look at: *tokens/s* (real target tokens, fair across batch sizes) rather than
    s/step when the batching differs; the *data wait* column says whether a run is
    input-bound (then a faster device will not help, the pipeline will); float16 helps on
    a T4 and not on a CPU; XLA's compilation cost is in the first step and in `Total (s)`.
''')


def notebook_01() -> nbformat.NotebookNode:
    return _notebook("01", [
        new_markdown_cell(NB01_INTRO),
        _parameters_cell(NB01_PARAMETERS),
        new_markdown_cell(SETUP_MARKDOWN),
        new_code_cell(SETUP_CELL),
        new_markdown_cell(NB01_DIAGNOSTICS_MARKDOWN),
        new_code_cell(NB01_DIAGNOSTICS),
        new_markdown_cell(NB01_CONFIG_MARKDOWN),
        new_code_cell(_config_cell(
            train_fields="epochs=1, steps_per_epoch=STEPS, validation_steps=VALIDATION_STEPS",
            pipeline_fields="batch_size=BATCH_SIZE, max_tokens=MAX_TOKENS")),
        new_markdown_cell(NB01_TRAIN_MARKDOWN),
        new_code_cell(NB01_TRAIN),
        new_markdown_cell(NB01_COMPARE_MARKDOWN),
        new_code_cell(NB01_COMPARE),
        new_markdown_cell(NB01_CPU_VS_GPU),
    ], accelerator=None)


# ----------------------------------------------------------------------------- notebook 02

NB02_INTRO = _src('''
    # Translate, inspect attention, score BLEU, export a SavedModel

    1. **Model**: load a finished training run (`RUN_DIR`), or train one here.
    2. **Translate** a few Portuguese sentences with `transformer.translator.Translator`
       (cached greedy or beam search).
    3. **Attention heatmap**: the last decoder layer's cross-attention for one sentence.
    4. **BLEU / chrF** (sacrebleu) on a held-out split with `transformer.evaluation`.
    5. **Export** a self-contained SavedModel (tokenizers inside) with `transformer.export`,
       reload it with plain `tf.saved_model.load` and check it translates exactly as the
       in-memory model.

    A GPU runtime (Runtime → Change runtime type → T4 GPU) trains much faster; on a CPU
    runtime lower `EPOCHS` or the model size in the next cell.
''')

NB02_PARAMETERS = "\n\n".join([
    REPO_PARAMETERS,
    DATA_PARAMETERS,
    _src('''
        # A finished training run directory to load (config.json + tokenizers/ + checkpoints/,
        # e.g. "runs/bible" from scripts/train.py, relative to the clone); None: train one here.
        RUN_DIR = None

        # Training here (ignored with RUN_DIR).
        MAX_TRAIN_EXAMPLES = None    # first N training pairs (None: all)
        MAX_VAL_EXAMPLES = 500
        VOCAB_SIZE = 8000            # WordPiece vocabulary per language
        NUM_LAYERS = 3               # the default recipe (docs/recipes.md): 3 layers, d_model 256, 8 heads, dff 1024
        D_MODEL = 256
        NUM_HEADS = 8
        DFF = 1024
        MAX_LENGTH = 128             # tokens per sentence, [START]/[END] included
        TIME_BUDGET_MINUTES = 30     # train for this much training time (None: EPOCHS epochs)
        EPOCHS = 10                  # with a time budget: at most this many
        STEPS = None                 # steps per epoch (None: one full pass over the training pairs)
        PRECISION = "auto"           # "off" (float32), "float16", "bfloat16"; "auto": float16 on a GPU, else off

        # Translation and evaluation.
        BEAM_SIZE = 1                # 1: cached greedy; > 1: beam search
        SENTENCES = [
            "este é um problema que temos que resolver.",
            "os meus vizinhos ouviram sobre esta ideia.",
            "No princípio, Deus criou os céus e a terra.",
            "Deus é amor.",
        ]
        EVAL_SPLIT = "auto"          # "auto": "test" for TFDS, "validation" for a local directory
        EVAL_LIMIT = 500             # first N pairs of the split (None: all)
    '''),
    _output_parameters('OUTPUT_ROOT = "runs/notebook02"   # the run (if trained here), attention.png, eval.json, export/'),
])

NB02_MODEL_MARKDOWN = _src('''
    ## Model

    With `RUN_DIR = None` this trains a model with `transformer.training.train()` (the same
    function as `scripts/train.py`; running the cell again retrains from scratch). Either way
    the `Translator` is built from the run directory's latest checkpoint and its own
    tokenizers, under the float32 policy (training may have used mixed precision).
''')

NB02_MODEL = _src('''
    import json

    import keras

    from transformer.config import DataConfig, ModelConfig, RunConfig, TokenizerConfig, TrainConfig
    from transformer.training import CONFIG_FILE, train
    from transformer.translator import DecodeConfig, translator_from_run

    if RUN_DIR is None:
        import tensorflow as tf

        run_dir = OUTPUT_ROOT / "run"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        precision = PRECISION
        if precision == "auto":
            precision = "float16" if tf.config.list_physical_devices("GPU") else "off"
        config = RunConfig(
            data=DataConfig(data_dir=DATA_DIR, dataset=DATASET, max_train_examples=MAX_TRAIN_EXAMPLES,
                            max_val_examples=MAX_VAL_EXAMPLES),
            tokenizer=TokenizerConfig(vocab_size=VOCAB_SIZE, root=str(TOKENIZER_ROOT)),
            model=ModelConfig(num_layers=NUM_LAYERS, d_model=D_MODEL, num_heads=NUM_HEADS, dff=DFF,
                              max_length=MAX_LENGTH),
            train=TrainConfig(epochs=EPOCHS, steps_per_epoch=STEPS, time_budget_minutes=TIME_BUDGET_MINUTES,
                              mixed_precision=precision, output_dir=str(run_dir), verbose=2),
        ).validate()
        result = train(config)
        print(json.dumps(result.summary, indent=1))
        RUN_DIR = result.output_dir
    RUN_DIR = (REPO_DIR / RUN_DIR).resolve()
    RUN_CONFIG = RunConfig.load(RUN_DIR / CONFIG_FILE)

    keras.mixed_precision.set_global_policy("float32")  # inference and export in float32
    translator = translator_from_run(RUN_DIR, DecodeConfig(beam_size=BEAM_SIZE))
    print(f"translator over {RUN_DIR}: {translator.model.count_params():,} parameters, "
          f"decoding {translator.config}")
''')

NB02_TRANSLATE_MARKDOWN = "## Translate"

NB02_TRANSLATE = _src('''
    from IPython.display import Image, Markdown, display

    TRANSLATIONS = translator.translate(SENTENCES)
    display(Markdown("| Portuguese | English (model) |\\n|---|---|\\n" + "\\n".join(
        f"| {source} | {translation} |" for source, translation in zip(SENTENCES, TRANSLATIONS))))
''')

NB02_ATTENTION_MARKDOWN = _src('''
    ## Attention heatmap

    Cross-attention of the last decoder layer, averaged over heads, while the model generated
    each English wordpiece (rows) for the first sentence's Portuguese wordpieces (columns).
''')

NB02_ATTENTION = _src('''
    from transformer.attention_plot import attention_for_sentence, plot_attention

    weights, source_tokens, target_tokens, translation = attention_for_sentence(translator.attention(SENTENCES[:1]), 0)
    heatmap = plot_attention(weights, source_tokens, target_tokens, OUTPUT_ROOT / "attention.png",
                             title=f"{SENTENCES[0]}\\n→ {translation}")
    display(Image(filename=str(heatmap)))
''')

NB02_EVAL_MARKDOWN = _src('''
    ## BLEU and chrF

    sacrebleu corpus scores on the run's own corpus: the TFDS `test` split, or `validation`
    for a local directory (the offline Bible corpus has no test split). References are cased
    and untokenized; the default tokenizers lower-case, so the lower-cased BLEU is shown too.
    Speed: one cold pass (tracing included), then one warm pass.
''')

NB02_EVAL = _src('''
    from transformer.evaluation import evaluate, load_eval_split, save_report

    data = RUN_CONFIG.data
    split = EVAL_SPLIT if EVAL_SPLIT != "auto" else ("validation" if data.data_dir else "test")
    sources, references = load_eval_split(data_dir=data.data_dir, dataset=None if data.data_dir else data.dataset,
                                          tfds_data_dir=data.tfds_data_dir, split=split, limit=EVAL_LIMIT)
    EVAL = evaluate(translator.translate_with_lengths, sources, references,
                    description={"model": str(RUN_DIR), "split": split})
    save_report(EVAL, OUTPUT_ROOT / "eval.json")
    display(Markdown(
        f"**{EVAL['num_sentences']} sentences of `{split}`**: BLEU {EVAL['bleu']}, "
        f"BLEU (lower-cased) {EVAL['bleu_lowercase']}, chrF {EVAL['chrf']}; "
        f"{EVAL['speed']['sentences_per_s']} sentences/s warm ({EVAL['speed_cold']['seconds']} s cold)\\n\\n"
        f"`{EVAL['bleu_signature']}`\\n\\n| source | reference | translation |\\n|---|---|---|\\n"
        + "\\n".join(f"| {e['source']} | {e['reference']} | {e['translation']} |" for e in EVAL["examples"][:3])))
''')

NB02_EXPORT_MARKDOWN = _src('''
    ## Export and reload

    `export_translator` writes a SavedModel with the tokenizers inside: serving it needs only
    `tensorflow` and `tensorflow_text` (which registers the tokenizer ops), not this repository.
    Signature `serving_default`: `{"sentences": tf.string [batch]}` → `{"translations": tf.string [batch]}`.
''')

NB02_EXPORT = _src('''
    from transformer.export import export_translator

    EXPORT_DIR = export_translator(translator, OUTPUT_ROOT / "export", overwrite=True,
                                   extra={"run_dir": str(RUN_DIR)})
    print(f"exported to {EXPORT_DIR}:", sorted(path.name for path in EXPORT_DIR.iterdir()))
''')

NB02_RELOAD = _src('''
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops the SavedModel uses)

    reloaded = tf.saved_model.load(str(EXPORT_DIR))
    serve = reloaded.signatures["serving_default"]
    outputs = serve(sentences=tf.constant(SENTENCES))["translations"]
    exported_translations = [text.decode("utf-8") for text in outputs.numpy()]
    for source, translation in zip(SENTENCES, exported_translations):
        print(f"{source}\\n  → {translation}")
    assert exported_translations == TRANSLATIONS, (exported_translations, TRANSLATIONS)
    print("\\nthe reloaded SavedModel translates exactly as the in-memory model")
''')


def notebook_02() -> nbformat.NotebookNode:
    return _notebook("02", [
        new_markdown_cell(NB02_INTRO),
        _parameters_cell(NB02_PARAMETERS),
        new_markdown_cell(SETUP_MARKDOWN),
        new_code_cell(SETUP_CELL),
        new_markdown_cell(NB02_MODEL_MARKDOWN),
        new_code_cell(NB02_MODEL),
        new_markdown_cell(NB02_TRANSLATE_MARKDOWN),
        new_code_cell(NB02_TRANSLATE),
        new_markdown_cell(NB02_ATTENTION_MARKDOWN),
        new_code_cell(NB02_ATTENTION),
        new_markdown_cell(NB02_EVAL_MARKDOWN),
        new_code_cell(NB02_EVAL),
        new_markdown_cell(NB02_EXPORT_MARKDOWN),
        new_code_cell(NB02_EXPORT),
        new_code_cell(NB02_RELOAD),
    ], accelerator="T4")


# ----------------------------------------------------------------------------- writing

NOTEBOOKS = {
    "01_train_cpu_vs_gpu.ipynb": notebook_01,
    "02_translate_and_export.ipynb": notebook_02,
}


def _parameters_cell(source: str) -> nbformat.NotebookNode:
    return new_code_cell(source, metadata={"tags": [PARAMETERS_TAG]})


def _notebook(prefix: str, cells: list, accelerator: str | None) -> nbformat.NotebookNode:
    for index, cell in enumerate(cells):
        cell["id"] = f"nb{prefix}-cell{index:02d}"  # stable ids: regenerating gives no diff
    colab = {"provenance": [], "toc_visible": True}
    metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "colab": colab,
    }
    if accelerator:
        colab["gpuType"] = accelerator
        metadata["accelerator"] = "GPU"
    notebook = new_notebook(cells=cells, metadata=metadata)
    nbformat.validate(notebook)
    return notebook


def render(build) -> str:
    return nbformat.writes(build(), version=4) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that the .ipynb files are up to date")
    args = parser.parse_args(argv)
    stale = []
    for name, build in NOTEBOOKS.items():
        path, text = HERE / name, render(build)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python notebooks/build_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
