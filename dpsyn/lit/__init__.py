"""LightningModules for the methods and metrics that have an SGD loop."""
