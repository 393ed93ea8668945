"""Model-building tooling, outside the runtime packages: the code that trains the ``tiny``
preset (its corpus, tool-call examples and training loop). Nothing that serves a request
imports it; the server loads what it wrote (``eclectus/models/tiny/``)."""
