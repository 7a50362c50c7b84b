"""The `keel` command line: `app` (the commands), the agent it builds from a run's settings,
the checks of its options, and what it plugs in (MCP servers, traces, `--events`)."""
