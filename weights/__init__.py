"""The node-local weight cache: sources (local, HTTP, Hub, S3) behind one interface, verified and
atomically published entries, LRU eviction that spares leased and pinned models, and `resolve`,
which replicas call before their engine starts. Imports only core; does I/O (it is the cache),
and keeps its one decision, which entries to evict, pure (eviction.py)."""
