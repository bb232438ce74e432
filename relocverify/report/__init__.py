"""The HTML correctness report: a static, self-contained directory built from a store.

``build.build_report`` writes it; ``data`` reads the store, ``sources`` names the
source directory of an address, ``charts`` draws the SVG charts, ``page`` writes
the summary HTML; ``assets/`` holds the page's one script and style sheet.

Two smaller answers from a store sit here too: ``shown``, one function annotated (``relocverify show``,
also verified now from an image), and ``probe_points``, the probe points a store's verdicts make safe,
which ``probe_files`` writes in a tracer's syntax (``relocverify export``)."""
