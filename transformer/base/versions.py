"""Start-up check that TensorFlow and tensorflow-text share a minor version.

tensorflow-text ships compiled kernels built against one TensorFlow ABI; a mismatch fails
at import with an undefined symbol, or later with "Op type not registered". Call
`check_versions()` before importing anything that imports `tensorflow_text`.
"""

from __future__ import annotations

import importlib.metadata

from transformer.base.errors import InputError


class VersionMismatchError(InputError, RuntimeError):
    """TensorFlow and tensorflow-text are not on the same minor version."""

    hint = "pip install -r requirements.txt installs matching versions"


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def fix_command(tf_version: str) -> str:
    return f"pip install 'tensorflow-text=={_minor(tf_version)}.*'"


def check_versions(tf_version: str | None = None, text_version: str | None = None) -> tuple[str, str]:
    """Returns (tensorflow, tensorflow-text) versions or raises VersionMismatchError.

    Versions are read from the installed distributions (no import needed), so this works
    even when importing tensorflow_text would crash.
    """
    try:
        tf_version = tf_version or importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        raise VersionMismatchError("TensorFlow is not installed: pip install -r requirements.txt") from None
    try:
        text_version = text_version or importlib.metadata.version("tensorflow-text")
    except importlib.metadata.PackageNotFoundError:
        raise VersionMismatchError(
            f"tensorflow-text is not installed (TensorFlow {tf_version}). Fix: {fix_command(tf_version)}"
        ) from None
    if _minor(tf_version) != _minor(text_version):
        raise VersionMismatchError(
            f"TensorFlow {tf_version} and tensorflow-text {text_version} are on different minor versions; "
            f"tensorflow-text's kernels only load into the TensorFlow they were built for. "
            f"Fix: {fix_command(tf_version)}  (or pip install -r requirements.txt)"
        )
    return tf_version, text_version
