"""Cross-attention heatmaps: source wordpieces on the x axis, generated ones on the y axis.

Uses matplotlib's object API (`Figure` + Agg canvas), never pyplot: no global state, no
display needed, safe in scripts, tests and threads.

    details = translator.attention(["olá mundo"])        # or ExportedTranslator.attention
    plot_attention(*attention_for_sentence(details, 0), "attention.png")
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np


def _decode(token) -> str:
    return token.decode("utf-8", "replace") if isinstance(token, bytes) else str(token)


def attention_for_sentence(details: dict, index: int = 0, head: Optional[int] = None):
    """One sentence's (attention `[target_len, source_len]`, source tokens, target tokens, translation).

    Args:
        details: the dict of `Translator.attention` / the export's `attention` signature
            (tensors or numpy arrays).
        index: int. Which sentence of the batch.
        head: optional int. One attention head; None averages the heads.
    """
    get = {k: np.asarray(v) for k, v in details.items()}
    src_len, tgt_len = int(get["source_lengths"][index]), int(get["target_lengths"][index])
    weights = get["attention"][index]  # [heads, T, S]
    weights = weights.mean(axis=0) if head is None else weights[head]
    source = [_decode(t) for t in get["source_tokens"][index][:src_len]]
    target = [_decode(t) for t in get["target_tokens"][index][:tgt_len]]
    return weights[:tgt_len, :src_len], source, target, _decode(get["translations"][index])


def plot_attention(attention: np.ndarray, source_tokens: Sequence[str], target_tokens: Sequence[str],
                   path: str | Path, title: Optional[str] = None, dpi: int = 120) -> Path:
    """Draws `attention [len(target_tokens), len(source_tokens)]` as a heatmap and saves it to `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    attention = np.asarray(attention, dtype=np.float32)
    expected = (len(target_tokens), len(source_tokens))
    if attention.shape != expected:
        raise ValueError(f"attention has shape {attention.shape}, expected [target, source] = {expected}")
    width = min(4 + 0.35 * len(source_tokens), 40)
    height = min(3 + 0.3 * len(target_tokens), 40)
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(attention, cmap="viridis", aspect="auto", vmin=0.0)
    axes.set_xticks(range(len(source_tokens)), labels=list(source_tokens), rotation=90)
    axes.set_yticks(range(len(target_tokens)), labels=list(target_tokens))
    axes.set_xlabel("source (Portuguese wordpieces)")
    axes.set_ylabel("generated (English wordpieces)")
    if title:
        axes.set_title(title, fontsize=9, wrap=True)
    figure.colorbar(image, ax=axes, fraction=0.03)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path
