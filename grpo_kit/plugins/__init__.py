"""Plugins found through entry points: the registry, lazy registration, the inventory."""
