"""Bad input through every script's `main(argv)`: `error:` + `hint:`, exit status 2, no traceback.

One table: each row writes its inputs under tmp_path, calls a script's main in-process and
checks the message (it must name the file/flag at fault), the status and that stderr holds
no traceback. Two rows run end to end in a subprocess (what a user sees, start-up included).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_where_a_gpu_is_visible

from transformer.base import errors

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def corpus(root: Path, pt: bytes | str, en: bytes | str, name: str = "train") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for suffix, text in (("pt", pt), ("en", en)):
        data = text.encode("utf-8") if isinstance(text, str) else text
        (root / f"{name}.{suffix}").write_bytes(data)
    return root


def good(root: Path) -> Path:
    return corpus(root, "um\ndois\n", "one\ntwo\n")


def report_file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


LISTENING = []  # sockets kept open while a row runs


def port_in_use() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    LISTENING.append(sock)
    return str(sock.getsockname()[1])


def locked(run: Path) -> Path:
    from transformer.runtime.runlock import LOCK_FILE

    run.mkdir(parents=True)
    (run / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": 0}))
    return run


def with_checkpoint(run: Path) -> Path:
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    return run


def saved_run(run: Path) -> Path:
    from transformer.base.config import ModelConfig, RunConfig

    run.mkdir(parents=True)
    RunConfig(model=ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, dropout_rate=0.1)).save(run / "config.json")
    return run


TRAIN = ["--device", "cpu", "--no-probe-peak", "--verbose", "0"]

# (id, script, argv(tmp) -> list, env, message regex, exit status)
CASES = [
    ("mismatched line counts", "train",
     lambda t: ["--data", str(corpus(t / "d", "um\ndois\ntrês\n", "one\ntwo\n")), "--output", str(t / "o"), *TRAIN],
     {}, r"line counts differ: .*train\.pt has 3 lines", 2),
    ("invalid UTF-8 at line 7", "train",
     lambda t: ["--data", str(corpus(t / "d", b"a\n" * 6 + b"\xff\xfe\n", "x\n" * 7)), "--output", str(t / "o"), *TRAIN],
     {}, r"train\.pt:7: invalid UTF-8", 2),
    ("binary file", "train",
     lambda t: ["--data", str(corpus(t / "d", bytes(range(256)) * 4, "x\n" * 5)), "--output", str(t / "o"), *TRAIN],
     {}, r"train\.pt:\d+: invalid UTF-8", 2),
    ("empty corpus", "train",
     lambda t: ["--data", str(corpus(t / "d", "", "")), "--output", str(t / "o"), *TRAIN], {}, "empty corpus", 2),
    ("whitespace-only corpus", "train",
     lambda t: ["--data", str(corpus(t / "d", " \n\t\n \r\n", "\n  \n\u3000\n")), "--output", str(t / "o"), *TRAIN],
     {}, "empty corpus", 2),
    ("missing --data directory", "train",
     lambda t: ["--data", str(t / "nope"), "--output", str(t / "o"), *TRAIN], {}, r"--data .*nope: directory not found", 2),
    ("directory where a file is expected", "train",
     lambda t: ["--train-src", str(good(t / "d")), "--train-tgt", str(t / "d" / "train.en"), "--output", str(t / "o"),
                *TRAIN], {}, r"/d is a directory; expected a text file", 2),
    ("--max-tokens -5", "train", lambda t: ["--max-tokens", "-5", "--output", str(t / "o")], {},
     r"pipeline\.max_tokens must be > 0, got -5 \(flag --max-tokens\)", 2),
    ("--epochs 0", "train", lambda t: ["--epochs", "0", "--output", str(t / "o")], {},
     r"train\.epochs must be > 0, got 0 \(flag --epochs\)", 2),
    ("--dropout 1.5", "train", lambda t: ["--dropout", "1.5", "--output", str(t / "o")], {},
     r"model\.dropout_rate .*\(flag --dropout\)", 2),
    ("--ema-decay 1", "train", lambda t: ["--ema-decay", "1", "--output", str(t / "o")], {},
     r"train\.ema_decay must be in \(0, 1\).*got 1\.0 \(flag --ema-decay\)", 2),
    ("--ema-decay nan", "train", lambda t: ["--ema-decay", "nan", "--output", str(t / "o")], {},
     r"train\.ema_decay must be in \(0, 1\).*got nan \(flag --ema-decay\)", 2),
    ("--ema-every 0", "train", lambda t: ["--ema-decay", "0.999", "--ema-every", "0", "--output", str(t / "o")], {},
     r"train\.ema_every must be an integer >= 1 .*got 0 \(flag --ema-every\)", 2),
    ("unknown TFDS name", "train",
     lambda t: ["--dataset", "no_such_dataset_xyz/pt_to_en", "--output", str(t / "o"), *TRAIN], {},
     "no_such_dataset_xyz", 2),
    ("bad TF_CONFIG", "train", lambda t: ["--data", str(good(t / "d")), "--output", str(t / "o"), *TRAIN],
     {"TF_CONFIG": "{oops"}, "TF_CONFIG is not valid JSON", 2),
    ("--device gpu without a GPU", "train",
     lambda t: ["--data", str(good(t / "d")), "--output", str(t / "o"), "--device", "gpu"], {},
     "--device gpu was requested but TensorFlow sees no GPU", 2),
    ("unwritable --output (under a file)", "train",
     lambda t: ["--data", str(good(t / "d")), "--output", str(report_file(t / "f", "x") / "run"), *TRAIN], {},
     r"cannot create the run directory .*/f/run", 2),
    ("second writer on the same --output", "train",
     lambda t: ["--data", str(good(t / "d")), "--output", str(locked(t / "o")), *TRAIN], {},
     rf"/o is in use by pid {os.getpid()} on ", 2),
    ("existing run without --resume", "train",
     lambda t: ["--data", str(good(t / "d")), "--output", str(with_checkpoint(t / "o")), *TRAIN], {},
     r"/o already holds checkpoints; pass --resume", 2),
    ("--resume with contradicting architecture flags", "train",
     lambda t: ["--resume", "--output", str(saved_run(t / "o")), "--num-layers", "3", "--d-model", "64",
                "--dropout", "0.1", *TRAIN], {},
     r"--resume: 2 flag\(s\) contradict .*--num-layers 3 \(the run has model\.num_layers = 1\); "
     r"--d-model 64 \(the run has model\.d_model = 16\)$", 2),
    ("--init-from a missing run", "train",
     lambda t: ["--data", str(good(t / "d")), "--init-from", str(t / "nope"), "--output", str(t / "o"), *TRAIN], {},
     r"--init-from .*/nope: run directory not found", 2),
    ("--init-from with contradicting architecture flags", "train",
     lambda t: ["--data", str(good(t / "d")), "--init-from", str(saved_run(t / "r")), "--output", str(t / "o"),
                "--num-layers", "3", "--d-model", "64", "--dropout", "0.3", *TRAIN], {},
     r"--init-from .*/r: 2 flag\(s\) contradict .*--num-layers 3 \(the run has model\.num_layers = 1\); "
     r"--d-model 64 \(the run has model\.d_model = 16\)$", 2),
    ("--init-from a run without checkpoints", "train",
     lambda t: ["--data", str(good(t / "d")), "--init-from", str(saved_run(t / "r")), "--output", str(t / "o"),
                *TRAIN], {},
     r"--init-from .*/r: no latest checkpoint in .*/r/checkpoints", 2),
    ("build_tokenizers: empty corpus", "build_tokenizers",
     lambda t: ["--data", str(corpus(t / "d", "\n", "\n")), "--tokenizers-root", str(t / "tok")], {},
     "empty corpus", 2),
    ("compare_reports: missing report", "compare_reports",
     lambda t: [str(t / "nope.json"), str(t / "nope2.json")], {}, r"report not found: .*nope\.json", 2),
    ("compare_reports: not JSON", "compare_reports",
     lambda t: [str(report_file(t / "a.json", "{")), str(report_file(t / "b.json", "{}"))], {},
     r"a\.json: not valid JSON", 2),
    ("compare_reports: JSON but not a report", "compare_reports",
     lambda t: [str(report_file(t / "a.json", "{}")), str(report_file(t / "b.json", "[]"))], {},
     r"a\.json: not a step-time report, missing keys", 2),
    ("translate: missing --file", "translate",
     lambda t: ["--model", str(t / "model"), "--file", str(t / "nope.pt"), "--output", str(t / "out.en")], {},
     r"--file .*nope\.pt: file not found", 2),
    ("translate: --block-lines 0", "translate", lambda t: ["--model", str(t), "--block-lines", "0", "olá"], {},
     "--block-lines must be > 0, got 0", 2),
    ("translate: --beam 0", "translate", lambda t: ["--model", str(t), "--beam", "0", "olá"], {},
     r"beam_size must be >= 1, got 0 \(flag --beam\)", 2),
    ("translate: --intra-op-threads -1", "translate", lambda t: ["--model", str(t), "--intra-op-threads", "-1", "olá"],
     {}, r"--intra-op-threads must be >= 0 \(0 = TensorFlow's default\), got -1", 2),
    ("export: --drop-finished 1", "export", lambda t: ["--run", str(t), "--output", str(t / "x"), "--drop-finished", "1"],
     {}, r"drop_finished must be in \[0, 1\), got 1.0 \(flag --drop-finished\)", 2),
    ("export: --projection-dtype bfloat16 --xla", "export",
     lambda t: ["--run", str(t), "--output", str(t / "x"), "--projection-dtype", "bfloat16", "--xla"],
     {}, r"projection_dtype bfloat16 needs the lean step: not with jit_compile \(flag --projection-dtype\)", 2),
    ("translate: --cut-over -1", "translate", lambda t: ["--model", str(t), "--cut-over", "-1", "olá"], {},
     r"cut_over must be >= 0 \(0 = the model's max_length - 2\), got -1 \(flag --cut-over\)", 2),
    ("export: --streams 0", "export", lambda t: ["--run", str(t), "--output", str(t / "x"), "--streams", "0"],
     {}, r"streams must be >= 1, got 0 \(flag --streams\)", 2),
    ("serve: --decoder-streams 0", "serve", lambda t: [str(t), "--decoder-streams", "0"], {},
     "--decoder-streams must be > 0, got 0", 2),
    ("benchmark_serving: --decoder-streams 0", "benchmark_serving", lambda t: [str(t), "--decoder-streams", "0"], {},
     "--decoder-streams must be > 0, got 0", 2),
    ("benchmark_decoding: --streams 0", "benchmark_decoding", lambda t: ["--run", str(t), "--streams", "0"], {},
     "--streams must be >= 1, got 0", 2),
    ("serve: --max-batch 0", "serve", lambda t: [str(t), "--max-batch", "0"], {}, "--max-batch must be > 0, got 0", 2),
    ("benchmark_serving: --max-batch 0", "benchmark_serving", lambda t: [str(t), "--max-batch", "0"], {},
     "--max-batch must be > 0, got 0", 2),
    ("serve: --max-wait-ms -1", "serve", lambda t: [str(t), "--max-wait-ms", "-1"], {},
     "--max-wait-ms must be >= 0, got -1.0", 2),
    ("benchmark_serving: --max-wait-ms -1", "benchmark_serving", lambda t: [str(t), "--max-wait-ms", "-1"], {},
     "--max-wait-ms must be >= 0, got -1.0", 2),
    ("serve: --max-texts over --max-queue", "serve", lambda t: [str(t), "--max-texts", "10", "--max-queue", "5"], {},
     r"--max-texts \(10\) must be <= --max-queue \(5\)", 2),
    ("serve: port in use", "serve", lambda t: [str(t), "--port", port_in_use()], {},
     r"--port \d+: cannot listen on 127\.0\.0\.1:\d+ \(Address already in use\)", 2),
    ("serve: not a model", "serve", lambda t: [str(t), "--port", "0"], {},
     "is neither an exported SavedModel .* nor a training run directory", 2),
    ("benchmark_serving: --concurrency 0", "benchmark_serving", lambda t: [str(t), "--concurrency", "4", "0"], {},
     "--concurrency must be > 0, got 0", 2),
    ("benchmark_serving: missing --sentences", "benchmark_serving",
     lambda t: [str(t), "--sentences", str(t / "nope.pt")], {}, r"--sentences .*nope\.pt: file not found", 2),
    ("average_checkpoints: no checkpoints", "average_checkpoints", lambda t: [str(t)], {},
     r"no checkpoints in .*checkpoints", 2),
    ("average_checkpoints: --last 0", "average_checkpoints", lambda t: [str(t), "--last", "0"], {},
     "--last must be >= 1", 2),
]


@pytest.mark.parametrize("name, script, argv, env, message, status", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line(name, script, argv, env, message, status, tmp_path, capsys, monkeypatch):
    if "without a GPU" in name:
        skip_where_a_gpu_is_visible()
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = load_script(script).main(argv(tmp_path))
    err = capsys.readouterr().err
    assert code == status, err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, err
    assert re.search(message, error_lines[0]), err
    assert err.splitlines()[-1].startswith("hint: ")


def test_version_mismatch_is_an_error_line(monkeypatch, capsys):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "2.20.1" if name == "tensorflow-text" else real(name))
    assert load_script("train").main(["--output", "/nonexistent/never-created"]) == 2
    err = capsys.readouterr().err
    assert "error: TensorFlow" in err and "tensorflow-text 2.20.1" in err and "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path, capsys):
    from transformer.data.corpora import CorpusError

    with pytest.raises(CorpusError, match="directory not found"):
        load_script("train").main(["--data", str(tmp_path / "nope"), "--output", str(tmp_path / "o"), *TRAIN,
                                   "--debug"])


def test_unexpected_errors_keep_their_traceback():
    @errors.command
    def main(argv):
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        main([])


def test_ctrl_c_is_an_error_line(capsys):
    @errors.command
    def main(argv):
        raise KeyboardInterrupt

    assert main([]) == 130
    assert capsys.readouterr().err.startswith("error: interrupted by SIGINT")


def run_script(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", errors.DEBUG_ENV)}
    environ.update(env or {}, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, str(SCRIPTS / f"{script}.py"), *args], capture_output=True, text=True,
                          env=environ, timeout=120)


def test_end_to_end_a_user_sees_two_lines(tmp_path):
    """As a user runs it: invalid UTF-8 at train.pt:7 → two lines on stderr, exit 2; --debug: the traceback."""
    data = corpus(tmp_path / "d", b"a\n" * 6 + b"\xc3\n", "x\n" * 7)
    result = run_script("train", "--data", str(data), "--output", str(tmp_path / "o"), *TRAIN)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    tail = result.stderr.strip().splitlines()[-2:]
    assert tail[0].startswith("error: ") and "train.pt:7: invalid UTF-8" in tail[0]
    assert tail[1].startswith("hint: ")
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["state"] == "crashed" and report["error"]["type"] == "CorpusError"
