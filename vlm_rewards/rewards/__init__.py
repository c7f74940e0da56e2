"""Reward models that need no neural backbone: plain functions, rules, and composites of any rewards."""
