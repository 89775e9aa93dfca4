"""The notebooks' setup, once the repository is on `sys.path`: Colab install, versions, paths.

A notebook's setup cell only finds its repository (on Colab: clones it), puts it on
`sys.path` and calls `setup`, so both notebooks share one definition of what "setup" means.
Imports nothing heavy at module level: the stale-module check of `install_requirements` must
run before TensorFlow, NumPy or Keras are imported.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from transformer.base.constants import SHARED_CORPUS

# Modules a Colab session may have imported before pip replaced them (then: restart the session).
PRELOADED_MODULES = ("numpy", "tensorflow", "keras", "matplotlib")
DRIVE_MOUNT = Path("/content/drive")
BIBLE_CORPUS = SHARED_CORPUS  # next to the clone: <repo>/../shared/...


def pip_install(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True)


def install_requirements(repo_dir: Path) -> None:
    """Colab: installs the pinned requirements.txt (and TensorFlow's CUDA libraries on a GPU).

    Raises RuntimeError when pip replaced a module this session had already imported: the
    session must be restarted (the second run finds everything in place).
    """
    requirements = Path(repo_dir) / "requirements.txt"
    pip_install("-r", str(requirements))
    if shutil.which("nvidia-smi"):  # GPU runtime: TensorFlow's CUDA libraries, same version pin
        pin = next(line.split("#")[0].strip() for line in requirements.read_text().splitlines()
                   if line.startswith("tensorflow=="))
        pip_install(pin.replace("tensorflow==", "tensorflow[and-cuda]=="))
    stale = [name for name in PRELOADED_MODULES
             if name in sys.modules
             and getattr(sys.modules[name], "__version__", None) != importlib.metadata.version(name)]
    if stale:
        raise RuntimeError(f"pip upgraded {stale}, already imported by this session: "
                           "Runtime → Restart session, then Runtime → Run all")


class NotebookPaths(NamedTuple):
    """Unpacks as (data_dir, output_root, tokenizer_root)."""

    data_dir: str | None  # a local corpus directory, or None for the TFDS dataset
    output_root: Path     # absolute, created
    tokenizer_root: Path  # absolute


def resolve_paths(repo_dir: Path, in_colab: bool, data_dir: str | None, output_root: str | Path,
                  tokenizer_root: str | Path | None, save_to_drive: bool) -> NotebookPaths:
    """The parameters cell's DATA_DIR / OUTPUT_ROOT / TOKENIZER_ROOT made concrete.

    data_dir "auto": the offline Bible corpus at <repo>/../shared/data/bible-pt-en outside
    Colab when present, else None (TFDS). A relative output_root is inside the clone, or inside
    MyDrive with save_to_drive on Colab (mounts Google Drive); tokenizer_root None means
    output_root/tokenizers, a relative one is inside the clone.
    """
    repo_dir = Path(repo_dir)
    if data_dir == "auto":
        bible = repo_dir.parent / BIBLE_CORPUS
        data_dir = str(bible) if not in_colab and bible.is_dir() else None
    if save_to_drive and in_colab:
        from google.colab import drive

        drive.mount(str(DRIVE_MOUNT))
        output_root = DRIVE_MOUNT / "MyDrive" / output_root
    output = (repo_dir / output_root).resolve()  # an absolute output_root stays as it is
    output.mkdir(parents=True, exist_ok=True)
    tokenizers = (repo_dir / tokenizer_root).resolve() if tokenizer_root else output / "tokenizers"
    return NotebookPaths(data_dir, output, tokenizers)


def setup(repo_dir: Path, in_colab: bool, data_dir: str | None, dataset: str, output_root: str | Path,
          tokenizer_root: str | Path | None, save_to_drive: bool, caching_allocator: bool = False) -> NotebookPaths:
    """The setup cell after the clone is importable: install (Colab), version check, paths; prints them.

    caching_allocator: a notebook that trains asks TensorFlow for its caching CPU allocator, as
    `scripts/train.py` does (`transformer.base.allocator`; effective only if this kernel has
    not started TensorFlow yet: after a restart).
    """
    if in_colab:
        install_requirements(repo_dir)  # raises if the session must be restarted first
    from transformer.base import cli
    from transformer.base.versions import check_versions

    cli.quiet_tensorflow()  # before TensorFlow is imported
    if caching_allocator:
        from transformer.base.allocator import use_caching_allocator

        use_caching_allocator()
    tf_version, text_version = check_versions()  # TensorFlow and tensorflow-text on one minor version
    paths = resolve_paths(repo_dir, in_colab, data_dir, output_root, tokenizer_root, save_to_drive)
    print(f"repository:   {repo_dir}  (Colab: {in_colab})")
    print(f"versions:     tensorflow {tf_version}, tensorflow-text {text_version}")
    print(f"data:         {paths.data_dir or 'TFDS ' + dataset}")
    print(f"outputs:      {paths.output_root}")
    print(f"tokenizers:   {paths.tokenizer_root}")
    return paths
