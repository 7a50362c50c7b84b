"""`keel serve`: a Keel agent behind the agent protocols (ADR 0040). A2A tasks are Keel runs
(`a2a_tasks`, `a2a_handler`), started, decided, cancelled and followed by one run service
(`runs`); `app.build_app` puts the routes behind one guard, `server.serve` listens."""
