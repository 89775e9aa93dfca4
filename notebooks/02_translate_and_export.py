# ---
# jupyter:
#   accelerator: GPU
#   colab:
#     gpuType: T4
#     provenance: []
#     toc_visible: true
#   jupytext:
#     notebook_metadata_filter: colab,accelerator,kernelspec,language_info
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
#   language_info:
#     name: python
# ---

# %% [markdown]
# # Translate, inspect attention, score BLEU, export a SavedModel
#
# 1. **Model**: load a finished training run (`RUN_DIR`), or train one here.
# 2. **Translate** a few Portuguese sentences with `transformer.inference.translator.Translator`
#    (cached greedy or beam search).
# 3. **Attention heatmap**: the last decoder layer's cross-attention for one sentence.
# 4. **BLEU / chrF** (sacrebleu) on a held-out split with `transformer.inference.evaluation`.
# 5. **Export** a self-contained SavedModel (tokenizers inside) with `transformer.inference.export`,
#    reload it with plain `tf.saved_model.load` and check it translates exactly as the
#    in-memory model.
#
# A GPU runtime (Runtime → Change runtime type → T4 GPU) trains much faster; on a CPU
# runtime lower `EPOCHS` or the model size in the next cell.

# %% tags=["parameters"]
# Colab only: where the code comes from (replace with this repository's public URL).
REPO_URL = "https://github.com/<org>/<repo>.git"
REPO_REF = "main"                 # branch or tag to clone
COLAB_REPO_DIR = "/content/nmt"   # where the clone goes on Colab

# Data. "auto": the TFDS TED talks corpus on Colab (downloaded there); elsewhere the
# offline Bible corpus at <repo>/../shared/data/bible-pt-en when present, else TFDS.
# Or a directory with train.pt/train.en/validation.pt/validation.en, or None for TFDS.
DATA_DIR = "auto"
DATASET = "ted_hrlr_translate/pt_to_en"   # the TFDS dataset used when DATA_DIR is None

# A finished training run directory to load (config.json + tokenizers/ + checkpoints/,
# e.g. "runs/bible" from scripts/train.py, relative to the clone); None: train one here.
RUN_DIR = None

# Training here (ignored with RUN_DIR).
MAX_TRAIN_EXAMPLES = None    # first N training pairs (None: all)
MAX_VAL_EXAMPLES = 500
VOCAB_SIZE = 8000            # WordPiece vocabulary per language
LOWER_CASE = False           # lower-case both sides before learning (the tutorial did); the references keep case
NUM_LAYERS = 3               # the default recipe (docs/recipes.md): 3 layers, d_model 256, 8 heads, dff 1024
D_MODEL = 256
NUM_HEADS = 8
DFF = 1024
MAX_LENGTH = 128             # tokens per sentence, [START]/[END] included
TIME_BUDGET_MINUTES = 30     # train for this much training time (None: EPOCHS epochs)
EPOCHS = 10                  # with a time budget: at most this many
STEPS = None                 # steps per epoch (None: one full pass over the training pairs)
PRECISION = "auto"           # "off" (float32), "float16", "bfloat16"; "auto": as scripts/train.py decides it

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

OUTPUT_ROOT = "runs/notebook02"   # the run (if trained here), attention.png, eval.json, export/
# A relative OUTPUT_ROOT is inside the repository clone, or inside MyDrive with
# SAVE_TO_DRIVE (Colab: mounts Google Drive, so results survive the runtime).
SAVE_TO_DRIVE = False
# Tokenizers are built once per corpus + vocabulary size and reused from here;
# None: OUTPUT_ROOT/tokenizers; a relative path is inside the clone (e.g. "tokenizers",
# shared with scripts/train.py).
TOKENIZER_ROOT = None

# %% [markdown]
# ## Setup
#
# On Colab this clones the repository into `COLAB_REPO_DIR` and installs its pinned
# `requirements.txt` (TensorFlow and tensorflow-text on the same minor version; on a GPU
# runtime also `tensorflow[and-cuda]`, the CUDA libraries this TensorFlow build expects).
# If pip had to upgrade a package this session had already imported, the cell stops and
# asks for **Runtime → Restart session**, then **Run all** again (the second time the
# setup finds everything in place). Outside Colab it uses the clone this notebook lives in
# and installs nothing: create the environment first (`pip install -r requirements.txt`).

# %%
import subprocess
import sys
from pathlib import Path

IN_COLAB = "google.colab" in sys.modules
if IN_COLAB:
    REPO_DIR = Path(COLAB_REPO_DIR)
    if not (REPO_DIR / "transformer").is_dir():
        if "<org>" in REPO_URL:
            raise ValueError("set REPO_URL in the parameters cell to this repository's git URL")
        subprocess.run(["git", "clone", "--depth", "1", "--branch", REPO_REF, REPO_URL, str(REPO_DIR)], check=True)
else:  # a local clone: notebooks/ is inside it; nothing is installed
    REPO_DIR = next((p for p in (Path.cwd(), *Path.cwd().parents) if (p / "transformer" / "__init__.py").is_file()),
                    None)
    if REPO_DIR is None:
        raise FileNotFoundError(f"no repository clone above {Path.cwd()}: start Jupyter inside the clone")
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from transformer.base.notebook_setup import setup  # the clone is importable from here on

DATA_DIR, OUTPUT_ROOT, TOKENIZER_ROOT = setup(REPO_DIR, IN_COLAB, DATA_DIR, DATASET, OUTPUT_ROOT, TOKENIZER_ROOT,
                                              SAVE_TO_DRIVE)

# %% [markdown]
# ## Model
#
# With `RUN_DIR = None` this trains a model with `transformer.training.trainer.train()` (the same
# function as `scripts/train.py`; running the cell again retrains from scratch). Either way
# the `Translator` is built from the run directory's latest checkpoint and its own
# tokenizers, under the float32 policy (training may have used mixed precision).

# %%
import json
import shutil

import keras

from transformer.base.config import DataConfig, DecodeConfig, ModelConfig, RunConfig, TokenizerConfig, TrainConfig
from transformer.inference.rundir import CONFIG_FILE, REPORT_FILE, translator_from_run
from transformer.training.trainer import train

if RUN_DIR is None:
    run_dir = OUTPUT_ROOT / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    config = RunConfig(
        data=DataConfig(data_dir=DATA_DIR, dataset=DATASET, max_train_examples=MAX_TRAIN_EXAMPLES,
                        max_val_examples=MAX_VAL_EXAMPLES),
        tokenizer=TokenizerConfig(vocab_size=VOCAB_SIZE, lower_case=LOWER_CASE, root=str(TOKENIZER_ROOT)),
        model=ModelConfig(num_layers=NUM_LAYERS, d_model=D_MODEL, num_heads=NUM_HEADS, dff=DFF,
                          max_length=MAX_LENGTH),
        train=TrainConfig(epochs=EPOCHS, steps_per_epoch=STEPS, time_budget_minutes=TIME_BUDGET_MINUTES,
                          mixed_precision=PRECISION, output_dir=str(run_dir), verbose=2),
    ).validate()
    result = train(config)  # "auto" precision / XLA: transformer/runtime/precision.py, as for scripts/train.py
    decision = json.loads((run_dir / REPORT_FILE).read_text())["run"]["precision_decision"]
    print(f"precision {decision['policy']}, XLA {'on' if decision['xla'] else 'off'}: {decision['reason']}")
    print(json.dumps(result.summary, indent=1))
    RUN_DIR = result.output_dir
RUN_DIR = (REPO_DIR / RUN_DIR).resolve()
RUN_CONFIG = RunConfig.load(RUN_DIR / CONFIG_FILE)

keras.mixed_precision.set_global_policy("float32")  # inference and export in float32
translator = translator_from_run(RUN_DIR, DecodeConfig(beam_size=BEAM_SIZE))
print(f"translator over {RUN_DIR}: {translator.model.count_params():,} parameters, "
      f"decoding {translator.config}")

# %% [markdown]
# ## Translate

# %%
from IPython.display import Image, Markdown, display

TRANSLATIONS = translator.translate(SENTENCES)
display(Markdown("| Portuguese | English (model) |\n|---|---|\n" + "\n".join(
    f"| {source} | {translation} |" for source, translation in zip(SENTENCES, TRANSLATIONS))))

# %% [markdown]
# ## Attention heatmap
#
# Cross-attention of the last decoder layer, averaged over heads, while the model generated
# each English wordpiece (rows) for the first sentence's Portuguese wordpieces (columns).

# %%
from transformer.measure.attention_plot import attention_for_sentence, plot_attention

weights, source_tokens, target_tokens, translation = attention_for_sentence(translator.attention(SENTENCES[:1]), 0)
heatmap = plot_attention(weights, source_tokens, target_tokens, OUTPUT_ROOT / "attention.png",
                         title=f"{SENTENCES[0]}\n→ {translation}")
display(Image(filename=str(heatmap)))

# %% [markdown]
# ## BLEU and chrF
#
# sacrebleu corpus scores on the run's own corpus: the TFDS `test` split, or `validation`
# for a local directory (the offline Bible corpus has no test split). References are cased
# and untokenized; with `LOWER_CASE = True` the translations are lower-cased, so the
# lower-cased BLEU is shown too.
# Speed: one cold pass (tracing included), then one warm pass.

# %%
from transformer.data.corpora import load_split
from transformer.inference.evaluation import evaluate, save_report

data = RUN_CONFIG.data
split = EVAL_SPLIT if EVAL_SPLIT != "auto" else ("validation" if data.data_dir else "test")
sources, references = load_split(data_dir=data.data_dir, dataset=None if data.data_dir else data.dataset,
                                      tfds_data_dir=data.tfds_data_dir, split=split, limit=EVAL_LIMIT)
EVAL = evaluate(translator.translate_with_lengths, sources, references,
                description={"model": str(RUN_DIR), "split": split})
save_report(EVAL, OUTPUT_ROOT / "eval.json")
display(Markdown(
    f"**{EVAL['num_sentences']} sentences of `{split}`**: BLEU {EVAL['bleu']}, "
    f"BLEU (lower-cased) {EVAL['bleu_lowercase']}, chrF {EVAL['chrf']}; "
    f"{EVAL['speed']['sentences_per_s']} sentences/s warm ({EVAL['speed_cold']['seconds']} s cold)\n\n"
    f"`{EVAL['bleu_signature']}`\n\n| source | reference | translation |\n|---|---|---|\n"
    + "\n".join(f"| {e['source']} | {e['reference']} | {e['translation']} |" for e in EVAL["examples"][:3])))

# %% [markdown]
# ## Export and reload
#
# `export_translator` writes a SavedModel with the tokenizers inside: serving it needs only
# `tensorflow` and `tensorflow_text` (which registers the tokenizer ops), not this repository.
# Signature `serving_default`: `{"sentences": tf.string [batch]}` → `{"translations": tf.string [batch]}`.

# %%
from transformer.inference.export import export_translator

EXPORT_DIR = export_translator(translator, OUTPUT_ROOT / "export", overwrite=True,
                               extra={"run_dir": str(RUN_DIR)})
print(f"exported to {EXPORT_DIR}:", sorted(path.name for path in EXPORT_DIR.iterdir()))

# %%
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer ops the SavedModel uses)

reloaded = tf.saved_model.load(str(EXPORT_DIR))
serve = reloaded.signatures["serving_default"]
outputs = serve(sentences=tf.constant(SENTENCES))["translations"]
exported_translations = [text.decode("utf-8") for text in outputs.numpy()]
for source, translation in zip(SENTENCES, exported_translations):
    print(f"{source}\n  → {translation}")
assert exported_translations == TRANSLATIONS, (exported_translations, TRANSLATIONS)
print("\nthe reloaded SavedModel translates exactly as the in-memory model")
