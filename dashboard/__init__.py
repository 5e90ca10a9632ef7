"""The browser dashboard: static assets served by the API."""
