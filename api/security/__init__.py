"""Who may call the API and from where: bearer tokens with scopes, the websocket's Origin,
the content types a write may carry, CORS and the dashboard's security headers.

Pure logic (scopes, tokens, origins, media types, the route policy) is free of I/O; the token
file and the ASGI middleware are the only parts that touch the outside."""
