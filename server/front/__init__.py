"""The front: transport, sessions, OpenAI /v1, auth, connections, the prompt's ids."""
