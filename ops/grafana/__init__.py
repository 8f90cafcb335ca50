"""The Grafana dashboard (hbmserve.json) and its queries (queries.py)."""
