"""What the server and the agents share: wire format, config, models, data, policies."""
