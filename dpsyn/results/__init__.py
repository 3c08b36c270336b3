"""Run outputs (atomic writers, sample grids, result records) and, later, the table builder. No torch import here."""
