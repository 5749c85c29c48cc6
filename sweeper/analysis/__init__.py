"""Analysis of a results directory, read-only.

- ``results``: loading the aggregated Parquet tables of a results directory;
- ``tables``: analysis tables (best configurations, stability, precisions, comparisons);
- ``plots``: one matplotlib figure per plot;
- ``report``: ``sweeper report``, the page of tables and plots, and ``render`` its HTML and Markdown;
- ``query``: ``sweeper query``, DuckDB SQL over the tables as views.
"""
