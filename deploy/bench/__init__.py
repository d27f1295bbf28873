"""``hermes-bench``: the testbed comparisons of the papers, as reports with plots, and microbenchmarks."""
