"""Analysis of a results directory: loading, tables, the report, plots, roofline
peaks and read-only SQL queries.
"""
