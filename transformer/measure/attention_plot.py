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

    A sentence cut into pieces (`rows` in `details`) is drawn as its pieces side by side: the
    pieces' source tokens in order on one axis, their generated tokens on the other, each
    piece's attention in its own block (a piece attends to its own source only; 0 elsewhere).

    Args:
        details: the dict of `Translator.attention` / the export's `attention` signature
            (tensors or numpy arrays; an export without `rows` has one piece per sentence).
        index: int. Which sentence of the batch.
        head: optional int. One attention head; None averages the heads.
    """
    get = {k: np.asarray(v) for k, v in details.items()}
    rows = get.get("rows", np.arange(len(get["source_lengths"])))
    blocks, source, target = [], [], []
    for piece in np.flatnonzero(rows == index):
        src_len, tgt_len = int(get["source_lengths"][piece]), int(get["target_lengths"][piece])
        weights = get["attention"][piece]  # [heads, T, S]
        weights = weights.mean(axis=0) if head is None else weights[head]
        blocks.append(weights[:tgt_len, :src_len])
        source += [_decode(t) for t in get["source_tokens"][piece][:src_len]]
        target += [_decode(t) for t in get["target_tokens"][piece][:tgt_len]]
    attention = np.zeros([len(target), len(source)], np.float32)
    t = s = 0
    for block in blocks:
        attention[t:t + block.shape[0], s:s + block.shape[1]] = block
        t, s = t + block.shape[0], s + block.shape[1]
    translations = get.get("line_translations", get["translations"])
    return attention, source, target, _decode(translations[index])


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
