"""Process plumbing of the web side: Django's HTTP handling on a reused thread pool
under ASGI, the web server's worker processes, and the Redis servers `make run` embeds.
See docs/operations.md."""

__all__ = ["embedded_redis", "request_threads", "web_processes"]
