"""What draws: matplotlib figures of attention maps, null dimensions and the layer x head overview (plots.py) and the
self-contained HTML report of analyze.py (report_html.py, with its overview.py, head_data.py and assets.py). Imports
the maths, never the callbacks."""
