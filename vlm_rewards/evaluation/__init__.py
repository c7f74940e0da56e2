"""Metrics and plots for judging reward models against labels and preferences."""
