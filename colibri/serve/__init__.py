"""colibri serve: an OpenAI-compatible HTTP server over one session of several sequence slots.

    app.py        the ASGI app (starlette): routes, auth, errors in OpenAI's shape, SSE, metrics
    schema.py     a request's JSON checked into a plain Request (every error names its field)
    scheduler.py  the one thread that owns the session and its colibri.Batch: admits waiting
                  requests into free slots, steps every running one together, hands each step's
                  text to the request's asyncio queue
    metrics.py    the Prometheus text of /metrics

docs/SERVING.md says what each flag, endpoint and metric does.
"""
