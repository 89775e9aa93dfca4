"""Serving a model over HTTP: dynamic batching on decoding threads (`batching`), the JSON API
and web page (`app`, `page`), the server and its graceful stop (`server`), and the load test
against offline batched decoding (`loadtest`).

May import `inference`, `model`, `data`, `measure`, `runtime` and `base`.
"""
