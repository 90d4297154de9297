"""The multi-tenant training service and the `twinkle-server` command."""
