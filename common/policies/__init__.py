"""Every policy kind (sync, gate, aggregation, lr scaling, allocation, topology) in one registry (``base``)."""
