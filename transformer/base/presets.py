"""Named recipes: a `RunConfig` base that command-line flags then override.

    python scripts/train.py --preset tutorial --pipeline naive   # the TF tutorial, as published
    python scripts/train.py                                       # the default recipe

"default" is `RunConfig()`: the recipe chosen by experiment on the shared bible-pt-en
corpus (docs/recipes.md). "tutorial" is the TF "NMT with a Transformer and Keras" recipe:
4 layers, d_model 128, dff 512, 8 heads of width d_model, dropout 0.1 from the first step, no label smoothing,
Adam(0.9, 0.98, 1e-9) on the inverse-square-root schedule with 4000 warmup steps, batches
of 64 sentences, at most 128 tokens per sentence, ~8k WordPiece vocabularies. Its pipeline
stays ours (tokenize once, buckets); add `--pipeline naive` for the tutorial's.
"""

from __future__ import annotations

from transformer.base.config import ModelConfig, PipelineConfig, RunConfig, TokenizerConfig, TrainConfig

PRESETS: dict[str, RunConfig] = {
    "default": RunConfig(),
    "tutorial": RunConfig(
        tokenizer=TokenizerConfig(vocab_size=8000, lower_case=True),
        model=ModelConfig(num_layers=4, d_model=128, num_heads=8, dff=512, dropout_rate=0.1,
                          head_width="tutorial", max_length=128),
        pipeline=PipelineConfig(batch_size=64, max_tokens=None),
        train=TrainConfig(lr_schedule="inverse-sqrt", peak_learning_rate=None, warmup_steps=4000,
                          label_smoothing=0.0, dropout_from_epoch=1),
    ),
}


def preset(name: str) -> RunConfig:
    """The named preset; a KeyError lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
