"""Several training corpora with sampling weights: what one epoch of a mixture is.

`--data A --data B:0.5` trains on a `Mixture` of two parts. One epoch of the mixture holds
`round(weight × pairs)` pairs of each part, interleaved at random in those proportions
(`tf.data.Dataset.sample_from_datasets`):

  * weight 1: every pair of the part once per epoch (a single corpus of weight 1 is exactly
    the corpus, as without mixing);
  * weight < 1: a fresh random subset each epoch (the part is shuffled and repeated, and the
    epoch takes its share), so over several epochs every pair is seen, `weight` times as often;
  * weight > 1: the part's pairs several times per epoch (again from a reshuffled stream).

`Mixture.epoch(per_part=...)` applies `per_part` to each part before mixing, so the optimized
pipeline tokenizes and caches every part once and mixes the cached ids: the subsets change
every epoch without re-tokenizing. `epoch(reshuffle=False)` gives the same pairs on every
iteration (used to learn the tokenizers' vocabulary, which then depends on the weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import tensorflow as tf

LEARN_SEED = 0  # the fixed epoch the tokenizer vocabulary is learned from


@dataclass(frozen=True)
class MixturePart:
    """One corpus of a mixture: `pairs` (src, tgt) tf.string scalars, `size` of them."""

    name: str
    pairs: tf.data.Dataset
    size: int
    weight: float = 1.0

    @property
    def share(self) -> int:
        """Pairs of this part in one epoch of the mixture (at least 1)."""
        return max(1, round(self.weight * self.size))


@dataclass(frozen=True)
class Mixture:
    """Weighted training corpora; see the module docstring for what an epoch is."""

    parts: tuple[MixturePart, ...]

    @property
    def epoch_size(self) -> int:
        return sum(part.share for part in self.parts)

    @property
    def is_plain(self) -> bool:
        """One part of weight 1: an epoch is the corpus itself, no sampling needed."""
        return len(self.parts) == 1 and self.parts[0].weight == 1.0

    def epoch(self, seed: Optional[int] = None, per_part: Optional[Callable] = None,
              shuffle_buffer: int = 20000, reshuffle: bool = True) -> tf.data.Dataset:
        """One epoch of the mixture (iterating again gives the next epoch's draw if `reshuffle`).

        per_part: (part index, dataset) → dataset, applied to each part's pairs first (e.g.
          tokenize + cache). Returns the parts' elements interleaved in proportion to `share`.
        """
        streams = [per_part(i, part.pairs) if per_part else part.pairs for i, part in enumerate(self.parts)]
        if self.is_plain:
            return streams[0]
        base = 0 if seed is None else seed
        taken = []
        for index, (part, stream) in enumerate(zip(self.parts, streams)):
            stream = stream.shuffle(min(shuffle_buffer, part.size), seed=base + index,
                                    reshuffle_each_iteration=reshuffle)
            if part.share != part.size:  # a subset, or several passes, per epoch
                stream = stream.repeat().take(part.share)
            taken.append(stream)
        total = float(self.epoch_size)
        return tf.data.Dataset.sample_from_datasets(
            taken, weights=[part.share / total for part in self.parts], seed=base + len(self.parts),
            stop_on_empty_dataset=False, rerandomize_each_iteration=reshuffle,
        )
