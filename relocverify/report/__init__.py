"""The HTML correctness report: a static, self-contained directory built from a store.

``build.build_report`` writes it; ``data`` reads the store, ``sources`` names the
source directory of an address, ``charts`` draws the SVG charts, ``page`` writes
the summary HTML; ``assets/`` holds the page's one script and style sheet."""
