"""TensorFlow's CUDA-probe chatter is hidden from commands, and nothing else written meanwhile is lost."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from transformer.base import cli
from transformer.base.startup_chatter import filtered_stderr

ABSL = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
NO_DRIVER = (b"I0000 00:00:1795933397.678453    8544 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
             b"GPU will not be used.\n")
CUINIT = (b"E0000 00:00:1795933402.474571    8544 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
          b"Failed call to cuInit: UNKNOWN ERROR (303)\n")


def written_to_fd2(tmp_path, *chunks: bytes, raise_inside: bool = False, no_driver: bool = False) -> bytes:
    """What reaches file descriptor 2 when `chunks` are written there inside `filtered_stderr`."""
    target = tmp_path / "fd2"
    with open(target, "wb") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            with filtered_stderr(no_driver=no_driver):
                for chunk in chunks:
                    os.write(2, chunk)
                if raise_inside:
                    raise ImportError("no module named tensorflow")
        except ImportError:
            pass
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return target.read_bytes()


def test_the_cuda_probe_lines_go_and_every_other_line_stays(tmp_path):
    other = b"UserWarning: something a user should read\n"
    assert written_to_fd2(tmp_path, ABSL, NO_DRIVER, other, ABSL, NO_DRIVER, CUINIT, b"last") == other + b"last"


def test_a_failing_cuinit_stays_where_a_driver_is_installed(tmp_path):
    """Without "Could not find cuda drivers" the cuInit failure is the diagnosis of a broken driver."""
    assert written_to_fd2(tmp_path, ABSL, CUINIT) == CUINIT


def test_after_an_import_without_a_driver_the_first_listings_cuinit_line_goes(tmp_path):
    other = b"E0000 00:00:1795933402.474571    8544 some_kernel.cc:12] an error a user should read\n"
    assert written_to_fd2(tmp_path, CUINIT, other, no_driver=True) == other


def test_what_was_written_comes_back_when_the_block_fails(tmp_path):
    assert written_to_fd2(tmp_path, b"Traceback (most recent call last):\n", NO_DRIVER, raise_inside=True) == (
        b"Traceback (most recent call last):\n")


@pytest.mark.parametrize("first", ["an op", "a device listing"])
def test_a_command_importing_tensorflow_shows_no_cuda_probe(first):
    """As a command starts (`cli.start()`), then imports TensorFlow and runs an op or lists the
    devices first: on a machine without an NVIDIA driver (CI's) neither the import's probe lines
    nor the first listing's cuInit failure reach stderr, and what the command writes does."""
    listing = "print(len(tf.config.list_physical_devices()))\n"
    op = "print(int(tf.reduce_sum(tf.ones([3]))))\n"
    script = ("import sys\n"
              "from transformer.base import cli\n"
              "cli.start()\n"
              "import tensorflow as tf\n"
              + (op + listing if first == "an op" else listing + op)
              + "print('the command says', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script], env=cli.subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "3" in done.stdout.split() and "the command says" in done.stderr
    for line in (ABSL, NO_DRIVER, CUINIT):
        assert line.decode().split("]")[-1].strip()[:40] not in done.stderr, done.stderr
