"""`--onednn`: TensorFlow's oneDNN ops switched for a process before TensorFlow starts, and reported."""

import logging
import os
import subprocess
import sys

import pytest

from transformer.runtime import onednn

PROCESS = """
import json, sys
from transformer.runtime.onednn import configure_onednn, onednn_state
configure_onednn(sys.argv[1], sys.argv[2])
import tensorflow as tf
tf.constant(1.0) + 1.0
print(json.dumps(onednn_state()))
"""


def _state_in_new_process(choice: str, env_value: str | None, dtype: str = "float32") -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if k != onednn.ENV_VAR}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if env_value is not None:
        env[onednn.ENV_VAR] = env_value
    out = subprocess.run([sys.executable, "-c", PROCESS, choice, dtype], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("choice, enabled", [("on", True), ("off", False)])
def test_choice_reaches_tensorflow(choice, enabled):
    # The user's variable says the opposite: the explicit flag wins.
    state = _state_in_new_process(choice, env_value="0" if enabled else "1")
    assert state == {"enabled": enabled, "env": "1" if enabled else "0", "asked": choice, "resolved": choice}


def test_default_keeps_the_users_variable():
    assert _state_in_new_process("default", env_value="1") == {"enabled": True, "env": "1", "asked": "default",
                                                               "resolved": "default"}


def test_auto_turns_them_off_for_a_float32_model():
    # TensorFlow's own choice differs by CPU (on with AVX-512 BF16/VNNI); auto's does not.
    assert _state_in_new_process("auto", env_value=None) == {"enabled": False, "env": "0", "asked": "auto",
                                                             "resolved": "off"}


def test_auto_leaves_a_bfloat16_model_and_the_users_variable_alone():
    assert _state_in_new_process("auto", env_value="1", dtype="bfloat16") == {
        "enabled": True, "env": "1", "asked": "auto", "resolved": "default"}
    # A float32 model with the user's own variable: the variable is the user's instruction.
    assert _state_in_new_process("auto", env_value="1")["enabled"] is True


@pytest.mark.parametrize("choice, dtype, resolved", [
    ("auto", "float32", "off"), ("auto", "bfloat16", "default"), ("on", "float32", "on"), ("off", "bfloat16", "off"),
    ("default", "float32", "default")])
def test_resolve(choice, dtype, resolved):
    assert onednn.resolve_onednn(choice, dtype) == resolved


def test_after_tensorflow_started_nothing_changes_and_a_warning_says_so(monkeypatch, caplog):
    import tensorflow  # noqa: F401  (the process's TensorFlow is loaded: the switch is read)

    running = onednn.onednn_enabled()
    assert isinstance(running, bool)
    monkeypatch.delenv(onednn.ENV_VAR, raising=False)
    with caplog.at_level(logging.WARNING, logger=onednn.__name__):
        assert onednn.configure_onednn("off" if running else "on") is None
    assert "not applied: TensorFlow is already loaded" in caplog.text
    assert onednn.ENV_VAR not in os.environ and onednn.onednn_enabled() == running


def test_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="auto, default, on, off"):
        onednn.configure_onednn("maybe")


def test_asking_for_what_already_runs_is_no_warning(monkeypatch, caplog):
    import tensorflow  # noqa: F401

    monkeypatch.delenv(onednn.ENV_VAR, raising=False)  # TensorFlow decided alone: no variable to compare
    with caplog.at_level(logging.WARNING, logger=onednn.__name__):
        onednn.configure_onednn("on" if onednn.onednn_enabled() else "off")
    assert "not applied" not in caplog.text
