"""infer-ctl, the management CLI: talks to the server's public HTTP API only (stdlib client)."""
