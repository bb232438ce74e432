"""The store stage: results in one SQLite file (``store``), and the persistent
proof cache shared by every store and image (``cache``)."""
