"""Webhook delivery: the SSRF-guarded client (``transport``) and the dispatcher."""
