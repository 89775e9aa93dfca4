"""Translating a file of any size: read, translate and write it block by block, in line order.

    for translations in translate_blocks(translator.translate, read_lines(stream), block_lines=1024):
        ...                                     # one list per block, in input order

One line of input (ended by `\\n`, `\\r\\n` or the end of the file) is one sentence; invalid
UTF-8 is replaced by U+FFFD. Each block goes to the translator in one call, which sorts it by
length and decodes it in chunks (`DecodeConfig.chunk_size`), so only a block is in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

BLOCK_LINES = 1024


def count_lines(path: str | Path) -> int:
    """Lines in a file (a last line without `\\n` counts), reading it in 1 MiB pieces."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            count += piece.count(b"\n")
            last = piece[-1:]
    return count + (last != b"\n")


def read_lines(stream: BinaryIO) -> Iterator[str]:
    """The lines of a binary stream as str, without their line ends."""
    for raw in stream:
        if raw.endswith(b"\n"):
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        yield raw.decode("utf-8", errors="replace")  # a bad byte must not stop the file


def translate_blocks(translate: Callable[[list], list], lines: Iterable[str],
                     block_lines: int = BLOCK_LINES) -> Iterator[list[str]]:
    """Translations of `lines`, one list per block of `block_lines`, in order."""
    block: list[str] = []
    for line in lines:
        block.append(line)
        if len(block) == block_lines:
            yield _checked(translate, block)
            block = []
    if block:
        yield _checked(translate, block)


def _checked(translate, block: list[str]) -> list[str]:
    out = translate(block)
    if len(out) != len(block):
        raise RuntimeError(f"the translator returned {len(out)} lines for {len(block)}")
    return out
