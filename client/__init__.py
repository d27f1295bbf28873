"""The Hermes edge agent (`hermes-client`). Must not import fastapi or uvicorn."""
