"""The audit log's API side: the middleware that records each change made through the API
(with the token's name) and GET /api/v1/audit. The entries live in store/audit.py."""
