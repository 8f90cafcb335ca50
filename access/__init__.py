"""Who may call what: API keys and tenants (keys.py), path classes (paths.py), the decision for
one request (authorize.py) and per-tenant rate limits (limits.py). Pure: reading the files and
answering HTTP belong to the front door (deployments/ingress/)."""
