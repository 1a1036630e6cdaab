"""Plugins with extra dependencies, written against the public plugin API only."""
