"""The translation service over real HTTP on 127.0.0.1: API, dynamic batching under concurrent
clients, bad input, graceful SIGTERM, and the web page in a headless browser.

One tiny export (a random tiny model over the session tokenizers) is loaded once per module;
each server runs in a thread of this process (port 0), except the SIGTERM test's, which is
`transformer-serve` in a subprocess. Every translation is compared with the offline
translator (`ExportedTranslator.translate`) on the same input.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse

import pytest
from conftest import script_main
from helpers_translation import BAD_INPUTS, tiny_ctranslate2_export, tiny_translator

from transformer.base import cli
from transformer.inference.export import export_translator, load_exported
from transformer.inference.translator import DecodeConfig
from transformer.runtime.threads import Threads, decoding_threads
from transformer.serving.app import ServeLimits
from transformer.serving.loadtest import make_requests, run_clients, share
from transformer.serving.server import BatchingConfig, ServerThread, load_model

SENTENCES = ["No princípio, Deus criou os céus e a terra.", "Deus é amor.", "Jesus chorou.",
             "E disse Deus: Haja luz; e houve luz.", "O Senhor é o meu pastor, nada me faltará.",
             "Porque Deus amou o mundo de tal maneira que deu o seu Filho unigênito, para que todo aquele que nele "
             "crê não pereça, mas tenha a vida eterna.", "bom dia", "a"]
EDGE = ["", "   ", "tab\there\x00nul\x07bell\x1bescape", "😀🎉👍 Deus é amor 🙏", "Привет", "\u2028line\u2029sep"]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    path = export_translator(tiny_translator(DecodeConfig(chunk_size=8)), tmp_path_factory.mktemp("serve") / "tiny")
    return path


@pytest.fixture(scope="module")
def model(export):
    return load_model(export)


@pytest.fixture(scope="module")
def offline(export):
    """The offline translator of the same export (its own load)."""
    return load_exported(export)


@pytest.fixture(scope="module")
def server(model):
    with ServerThread(model, BatchingConfig(max_batch=16, max_wait_ms=5, mode="step")) as running:
        yield running


def request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, JSON or text body) of one request on a fresh connection."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    try:
        headers = headers or {}
        connection.request(method, path, body=body, headers=headers, encode_chunked="Transfer-Encoding" in headers)
        response = connection.getresponse()
        data = response.read()
        kind = response.getheader("content-type", "")
        return response.status, dict(response.getheaders()), json.loads(data) if "json" in kind else data.decode()
    finally:
        connection.close()


def translate(url, texts):
    return request(url, "POST", "/v1/translate", json.dumps({"texts": texts}).encode(),
                   {"Content-Type": "application/json"})


def test_translate_health_model_and_page(server, offline, export):
    status, _, body = translate(server.url, SENTENCES + EDGE)
    assert status == 200, body
    assert body["translations"] == offline.translate(SENTENCES + EDGE)
    assert body["model"] == export.name and body["elapsed_ms"] > 0
    assert [t for t, s in zip(body["translations"], SENTENCES + EDGE) if not s.strip()] == ["", ""]
    status, _, body = translate(server.url, [])
    assert (status, body["translations"]) == (200, [])
    status, _, health = request(server.url, "GET", "/health")
    assert status == 200 and health["status"] == "ready" and health["sentences"] >= len(SENTENCES + EDGE)
    status, _, info = request(server.url, "GET", "/v1/model")
    assert status == 200 and info["kind"] == "export" and info["name"] == export.name
    manifest = offline.manifest
    assert info["vocabulary"] == {"source": manifest["model"]["src_vocab_size"], "target": manifest["model"]["tgt_vocab_size"]}
    assert info["model_config"]["d_model"] == 16 and info["precision"] == "float32"
    assert info["created"] == manifest["created"] and info["batching"]["max_batch"] == 16
    status, headers, page = request(server.url, "GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert 'id="source"' in page and 'id="translate"' in page and "v1/translate" in page


def test_lone_surrogate_translates_as_the_offline_translator_does_with_invalid_bytes(server, offline):
    body = b'{"texts": ["Deus \\ud800 amor", "abc"]}'
    status, _, out = request(server.url, "POST", "/v1/translate", body, {"Content-Type": "application/json"})
    assert status == 200, out
    assert out["translations"] == offline.translate([b"Deus \xed\xa0\x80 amor", b"abc"])


@pytest.fixture(scope="module")
def streams_server(model):
    """Run batching with two decoder calls at once."""
    with ServerThread(model, BatchingConfig(max_batch=16, max_wait_ms=5, mode="run", streams=2)) as running:
        yield running


@pytest.fixture(scope="module")
def step_streams_server(model):
    """Step batching with two running batches, one thread each."""
    with ServerThread(model, BatchingConfig(max_batch=16, max_wait_ms=5, mode="step", streams=2)) as running:
        yield running


@pytest.mark.parametrize("which", ["server", "streams_server", "step_streams_server"])
def test_concurrent_clients_get_their_own_translations_in_dynamic_batches(which, offline, request):
    server = request.getfixturevalue(which)
    plan = share(make_requests(SENTENCES + EDGE + BAD_INPUTS[:4], requests=160, max_texts_per_request=4, seed=1),
                 clients=16)
    texts = sorted({t for requests in plan for request in requests for t in request})
    reference = dict(zip(texts, offline.translate(texts)))
    before = dict(server.batcher.stats)
    run = run_clients(server.url, plan)
    flat = [r for client in run["results"] for r in client]
    assert len(flat) == 160
    assert [r["body"] for r in flat if r["status"] != 200] == []
    for r in flat:
        assert r["body"]["translations"] == [reference[t] for t in r["texts"]]
    joins = server.batcher.stats["batches"] - before["batches"]
    assert joins < 160  # requests joined decoder calls together
    if which != "streams_server":
        steps = server.batcher.stats["steps"] - before["steps"]
        assert server.batcher.mode == "step"
        assert (server.batcher.stats["row_steps"] - before["row_steps"]) / steps > 2  # and shared its steps
        assert sum(t.is_alive() for t in server.batcher._threads) == server.batcher.streams
    else:
        assert server.batcher.mode == "run" and sum(t.is_alive() for t in server.batcher._threads) == 2
    assert server.batcher.queued == 0


@pytest.fixture(scope="module")
def ct2_export(tmp_path_factory):
    """The CTranslate2 export of a tiny translator (CTranslate2 decodes it; our tokenizers)."""
    return tiny_ctranslate2_export(tmp_path_factory.mktemp("serve-ct2"), DecodeConfig(chunk_size=8), seed=1)[1]


def test_a_ctranslate2_export_is_served_in_run_batches_as_it_translates_offline(ct2_export):
    model = load_model(ct2_export)
    assert model.engine is None and BatchingConfig(mode="step").resolve(model).mode == "run"  # no step engine
    offline = load_model(ct2_export).translate  # its own load, as the load test's offline figure
    plan = share(make_requests(SENTENCES + EDGE, requests=64, max_texts_per_request=4, seed=2), clients=16)
    texts = sorted({t for requests in plan for request in requests for t in request})
    reference = dict(zip(texts, offline(texts)))
    with ServerThread(model, BatchingConfig(max_batch=8, max_wait_ms=5, mode="run", streams=2)) as server:
        run = run_clients(server.url, plan)
        status, _, info = request(server.url, "GET", "/v1/model")
        joins = server.batcher.stats["batches"]
    flat = [r for client in run["results"] for r in client]
    assert len(flat) == 64 and [r["body"] for r in flat if r["status"] != 200] == []
    for r in flat:
        assert r["body"]["translations"] == [reference[t] for t in r["texts"]]
    assert joins < 64  # requests shared CTranslate2 calls
    assert status == 200 and info["kind"] == "ctranslate2" and info["precision"] == "float32"
    assert info["model_config"]["d_model"] == 16 and info["decode"]["chunk_size"] == 8 and info["ctranslate2"]
    assert load_model(ct2_export, compute_type="int8").info["precision"] == "int8"


def test_step_batching_runs_one_batch_per_decoder_stream(model):
    assert BatchingConfig(mode="step").resolve(model).streams == 1
    assert BatchingConfig(mode="step", streams=2).resolve(model).streams == 2


def test_thread_pools_follow_the_batching(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"")
    (export / "translator.json").write_text(json.dumps({"decode": {"streams": 5}}))
    assert BatchingConfig(mode="step").threads(export) == Threads()  # one thread drives the batch: TF's defaults
    assert BatchingConfig(mode="step", streams=2).threads(export) == decoding_threads(2)  # one loop per batch
    assert BatchingConfig(mode="run", streams=3).threads(tmp_path, DecodeConfig(streams=1)) == decoding_threads(3)
    assert BatchingConfig(mode="run").threads(tmp_path, DecodeConfig(streams=1)) == decoding_threads(2)
    assert BatchingConfig(mode="run").threads(export) == decoding_threads(5)  # the export's own loops
    assert BatchingConfig(mode="run").threads(export, intra_op=0).intra_op == 0


def big(n):
    return json.dumps({"texts": ["a"] * n}).encode()


# (id, method, path, body, headers, status, message regex)
BAD = [
    ("not JSON", "POST", "/v1/translate", b"{texts: [", {}, 400, "not valid JSON"),
    ("empty body", "POST", "/v1/translate", b"", {}, 400, "not valid JSON"),
    ("invalid UTF-8 body", "POST", "/v1/translate", b'{"texts": ["\xff"]}', {}, 400, "not UTF-8"),
    ("JSON array", "POST", "/v1/translate", '["olá"]'.encode(), {}, 400, 'JSON object with the field "texts", got a JSON array'),
    ("JSON string", "POST", "/v1/translate", '"olá"'.encode(), {}, 400, "got a JSON string"),
    ("missing texts", "POST", "/v1/translate", b'{"text": ["ola"]}', {}, 400, 'unknown field "text"'),
    ("empty object", "POST", "/v1/translate", b"{}", {}, 400, 'missing field "texts"'),
    ("texts a string", "POST", "/v1/translate", b'{"texts": "ola"}', {}, 400, r'"texts" must be a list .*string'),
    ("texts an object", "POST", "/v1/translate", b'{"texts": {"a": 1}}', {}, 400, "got a JSON object"),
    ("texts null", "POST", "/v1/translate", b'{"texts": null}', {}, 400, "got a JSON null"),
    ("a number in texts", "POST", "/v1/translate", b'{"texts": ["a", 3]}', {}, 400,
     r'"texts\[1\]" must be a string, got a JSON number'),
    ("null in texts", "POST", "/v1/translate", b'{"texts": [null]}', {}, 400, r'"texts\[0\]" .*null'),
    ("nested list", "POST", "/v1/translate", b'{"texts": [["a"]]}', {}, 400, r'"texts\[0\]" .*array'),
    ("extra field", "POST", "/v1/translate", b'{"texts": ["a"], "beam": 4}', {}, 400, 'unknown field "beam"'),
    ("too many texts", "POST", "/v1/translate", big(9), {}, 413, r'holds 9 texts; at most 8'),
    ("text too long", "POST", "/v1/translate", json.dumps({"texts": ["a", "x" * 101]}).encode(), {}, 413,
     r'"texts\[1\]" has 101 characters; at most 100'),
    ("body too large", "POST", "/v1/translate", json.dumps({"texts": ["x" * 90] * 8}).encode() + b" " * 400, {}, 413,
     "body of .* bytes; at most 1000"),
    ("chunked body too large", "POST", "/v1/translate", iter([b" " * 600, b" " * 600]), {"Transfer-Encoding": "chunked"},
     413, "body over 1000 bytes"),
    ("Content-Length not a number", "POST", "/v1/translate", b"{}", {"Content-Length": "abc"}, 400,
     "invalid HTTP request: .*Content-Length"),
    ("negative Content-Length", "POST", "/v1/translate", b"{}", {"Content-Length": "-2"}, 400, "invalid HTTP request"),
    ("bad Content-Length, large body", "POST", "/v1/translate", b"x" * 200_000, {"Content-Length": "1e3"}, 400,
     "invalid HTTP request"),
    ("unknown route", "GET", "/v2/translate", None, {}, 404, "no route /v2/translate"),
    ("GET on translate", "GET", "/v1/translate", None, {}, 405, "GET is not allowed on /v1/translate"),
    ("POST on health", "POST", "/health", b"{}", {}, 405, "POST is not allowed"),
]


@pytest.fixture(scope="module")
def strict_server(model):
    limits = ServeLimits(max_texts=8, max_chars=100, max_body_bytes=1000)
    with ServerThread(model, BatchingConfig(max_batch=8), limits) as running:
        yield running


@pytest.mark.parametrize("name, method, path, body, headers, status, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_json_error(strict_server, offline, name, method, path, body, headers, status, message):
    got, response_headers, out = request(strict_server.url, method, path, body, headers)
    assert got == status, out
    assert isinstance(out, dict) and set(out) == {"error"}, out
    assert re.search(message, out["error"]), out
    status, _, ok = translate(strict_server.url, ["Deus é amor."])  # still serving
    assert status == 200 and ok["translations"] == offline.translate(["Deus é amor."])


def test_full_queue_is_503_with_retry_after_and_a_slow_request_504(model, offline):
    with ServerThread(model, BatchingConfig(max_batch=64, max_wait_ms=1500, max_queue=4),
                      ServeLimits(max_texts=4, timeout_s=5)) as running:
        first = {}
        thread = threading.Thread(target=lambda: first.update(zip(("status", "headers", "body"),
                                                                 translate(running.url, ["um", "dois", "três"]))))
        thread.start()
        deadline = time.monotonic() + 10
        while running.batcher.queued < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        status, headers, body = translate(running.url, ["quatro", "cinco"])
        assert status == 503 and headers["retry-after"] == "1" and "busy" in body["error"], body
        thread.join()
        assert first["status"] == 200 and first["body"]["translations"] == offline.translate(["um", "dois", "três"])
    with ServerThread(model, BatchingConfig(max_batch=64, max_wait_ms=3000), ServeLimits(timeout_s=0.2)) as running:
        status, _, body = translate(running.url, ["Deus é amor."])
        assert status == 504 and "no translation within 0.2 s" in body["error"], body
        assert running.batcher.stats["timed_out"] == 1


def test_sigterm_during_load_answers_every_accepted_request_and_exits_0(export, offline):
    process = subprocess.Popen(cli.command_line("serve", str(export), "--port", "0", "--max-wait-ms", "20"),
                               stderr=subprocess.PIPE, text=True, env=cli.subprocess_env())
    try:
        url = None
        for line in process.stderr:
            match = re.match(r"ready: (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url, "the server never said it was ready"
        plan = share(make_requests(SENTENCES, requests=200, max_texts_per_request=3, seed=2), clients=8)
        outcome = {}
        loader = threading.Thread(target=lambda: outcome.update(run_clients(url, plan, timeout_s=60)))
        loader.start()
        deadline = time.monotonic() + 60
        while request(url, "GET", "/health")[2]["answered"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGTERM once the load is under way
        process.send_signal(signal.SIGTERM)
        loader.join(120)
        assert process.wait(60) == 0
        tail = process.stderr.read()
        stopped = re.search(r"stopped by SIGTERM: (\d+) requests accepted, (\d+) answered", tail)
        assert stopped, tail
    finally:
        if process.poll() is None:
            process.kill()
    flat = [r for client in outcome["results"] for r in client]
    answered = [r for r in flat if r["status"] == 200]
    assert answered, "no request was answered before SIGTERM"
    # Every request the server accepted was answered, and reached its client; the others never
    # got in: refused connections, or idle keep-alive connections closed by the stop.
    assert int(stopped.group(1)) == int(stopped.group(2)) == len(answered), tail
    assert {r["status"] for r in flat} <= {200, 0}
    refused = ("ConnectionRefused", "BrokenPipe", "RemoteDisconnected", "ConnectionReset")
    assert all(r["body"]["error"].startswith(refused) for r in flat if r["status"] == 0)
    texts = sorted({t for r in answered for t in r["texts"]})
    reference = dict(zip(texts, offline.translate(texts)))
    for r in answered:
        assert r["body"]["translations"] == [reference[t] for t in r["texts"]]


def test_benchmark_serving_reports_every_level_against_offline_in_one_run(export, tmp_path, capsys):
    sentences, report = tmp_path / "sentences.pt", tmp_path / "report.json"
    sentences.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    assert script_main("benchmark_serving")([str(export), "--output", str(report), "--concurrency", "1", "4",
                                             "--requests", "12", "--sentences", str(sentences), "--rounds", "2",
                                             "--batching", "step"]) == 0
    out = json.loads(report.read_text())
    assert out["requests"] == 12 and out["sentences"] >= 12 and out["batching"]["max_batch"] == 8  # the chunk_size
    assert out["offline"]["chunk_size"] == 8 and len(out["offline"]["per_round"]) == 2
    assert [level["clients"] for level in out["levels"]] == [1, 4]
    for level in out["levels"]:
        assert level["requests"] == 24 and level["failed_requests"] == 0 and level["wrong_translations"] == 0
        assert len(level["per_round"]) == 2 and level["batches"] >= 1
        assert level["vs_offline"] == pytest.approx(sorted(level["ratio_per_round"])[0] / 2
                                                    + sorted(level["ratio_per_round"])[1] / 2)
        assert 0 < level["latency_ms"]["p50"] <= level["latency_ms"]["p95"] <= level["latency_ms"]["max"]
    one, four = out["levels"]
    assert one["mean_batch"] <= 4  # alone, a request joins the decode by itself
    assert four["rows_per_step"] > one["rows_per_step"]  # 4 clients' sentences share the steps
    assert out["environment"]["cpu_model"] and len(out["load_average"]) == 3 and out["date"]
    assert "x offline" in capsys.readouterr().out


def test_the_web_page_in_a_headless_browser(server, offline):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them: apt-get install -y "
                    "chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium")
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        driver.get(server.url + "/")
        box = driver.find_element(By.ID, "source")
        box.clear()
        box.send_keys("O Senhor é o meu pastor.")
        driver.find_element(By.ID, "translate").click()
        WebDriverWait(driver, 30).until(lambda d: "ms" in d.find_element(By.ID, "status").text)
        assert "translated in" in driver.find_element(By.ID, "status").text
        expected = offline.translate(["O Senhor é o meu pastor."])[0]
        assert expected and driver.find_element(By.ID, "translation").text == expected
    finally:
        driver.quit()
