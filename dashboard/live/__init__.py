"""The live view's server side: websocket consumers, the per-socket fan-out of events,
the Origin policy, and the snapshots a socket receives when it joins.
See docs/live-view.md."""

__all__ = ["consumers", "fanout", "origins", "snapshots"]
