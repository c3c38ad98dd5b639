"""Developer tools that stay in the checkout: not installed with relaxc (docs/tools.md)."""
