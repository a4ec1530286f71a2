"""Configurations: the stock config of each architecture under a fivefold model type."""
