"""Running a script in a fresh Python process that cannot import this project (exports and
tokenizers must load with TensorFlow + tensorflow-text only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_without_project(script: str, *args: str, cwd, stdin: str | None = None, timeout: float = 120):
    """Runs `python -c script *args` in `cwd` without PYTHONPATH; asserts it exits 0 and returns
    the JSON object its last stdout line holds."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    result = subprocess.run([sys.executable, "-c", script, *args], input=stdin, cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
