"""The web page served at `/`: a text box, a Translate button, the translation and its time.

One line of the box is one sentence (`POST /v1/translate`); the page needs no other file.
"""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Portuguese → English</title>
<style>
  body { font: 16px/1.5 system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; }
  textarea { width: 100%; box-sizing: border-box; font: inherit; padding: .5rem; }
  button { font: inherit; padding: .4rem 1.2rem; margin: .5rem 0; }
  #translation { white-space: pre-wrap; border: 1px solid #ccc; padding: .5rem; min-height: 3rem; }
  #status { color: #555; font-size: .9rem; }
  .error { color: #b00; }
</style>
</head>
<body>
<h1>Portuguese → English</h1>
<label for="source">Portuguese (one sentence per line)</label>
<textarea id="source" rows="6" autofocus>No princípio, Deus criou os céus e a terra.</textarea>
<button id="translate" type="button">Translate</button>
<div id="translation" aria-live="polite"></div>
<p id="status"></p>
<p id="model"></p>
<script>
const source = document.getElementById("source"), button = document.getElementById("translate");
const output = document.getElementById("translation"), status = document.getElementById("status");
async function translate() {
  button.disabled = true;
  status.className = ""; status.textContent = "translating…";
  const started = performance.now();
  try {
    const response = await fetch("v1/translate", {method: "POST", headers: {"Content-Type": "application/json"},
                                                  body: JSON.stringify({texts: source.value.split("\\n")})});
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    output.textContent = body.translations.join("\\n");
    const total = Math.round(performance.now() - started);
    status.textContent = `translated in ${body.elapsed_ms.toFixed(1)} ms on the server, ${total} ms in all`;
  } catch (err) {
    status.className = "error"; status.textContent = "error: " + err.message;
  } finally {
    button.disabled = false;
  }
}
button.addEventListener("click", translate);
source.addEventListener("keydown", e => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translate(); });
fetch("v1/model").then(r => r.json()).then(m => {
  document.getElementById("model").textContent = `model: ${m.name} (${m.precision}, exported ${m.created || "—"})`;
}).catch(() => {});
</script>
</body>
</html>
"""
