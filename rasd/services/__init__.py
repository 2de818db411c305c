"""The services a RAS node runs on top of the carrier (``rasd.net``): the client port, the Prometheus metrics and
their server process, and the verdict journal. The carrier imports none of them: ``rasd.api`` (and whoever starts a
node) hands them to the runtime, which starts each one on the RAS thread and offers it the hooks it needs
(docs/architecture.md section 1)."""
