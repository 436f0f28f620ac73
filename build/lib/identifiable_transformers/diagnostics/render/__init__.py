"""What draws: matplotlib figures of attention maps and null dimensions (plots.py) and the
self-contained HTML report of analyze.py (report_html.py). Imports the maths, never the callbacks."""
