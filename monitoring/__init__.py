"""Monitoring as code: the Grafana dashboard generator (``dashboard.py``) and its docs rendering (``render.py``)."""
