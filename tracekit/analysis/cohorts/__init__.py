"""Cohorts: a release as weighted arrays, its statistics, counterfactuals and attribute lift."""
