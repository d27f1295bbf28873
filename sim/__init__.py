"""hermes-sim: the real engine and policies on a virtual clock, with simulated device populations."""
