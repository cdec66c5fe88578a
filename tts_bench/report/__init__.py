"""How results leave the run: tables (markdown, rich, CSV, JSON), plots, CI summaries, progress."""
