"""The HTTP service: a FastAPI app (``app.create_app``) and its job runner.

Layers: ``routes/`` parse a request, call one function of ``service`` and turn the result
into a schema of ``schemas``; ``errors`` maps domain errors to HTTP errors; ``security``
checks the bearer token; ``limits`` caps request bodies; ``submission`` turns a posted
document into a validated ``JobSpec``.
"""
