"""The Hermes parameter server: FastAPI control plane + ZeroMQ data plane."""
