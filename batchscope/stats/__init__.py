"""Statistics shared by the components: classic cumulative-bucket histograms kept as count arrays."""
