"""Per-request decisions, pure: `admit` (accept now, or refuse with a reason and Retry-After)
and `choose` (rank replicas for one request). A brain: imports only hbmserve.core."""
